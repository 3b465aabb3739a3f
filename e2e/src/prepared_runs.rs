//! The harness of the prepared-run tests, tests/prepared.rs (runs crafted as a preparing release
//! writes them) and tests/preparing.rs (runs the controller prepares itself): their controllers,
//! small readers of a SingletonJob and its Jobs, and [`JobWatch`], a watch of a namespace's Jobs
//! that keeps every state each Job went through, so that a Job marked and deleted within a moment
//! is still judged, and printed on failure.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use singleton::api::SingletonJobStatus;
use singleton::naming::{self, ANNOTATION_RELEASED, ANNOTATION_RESUME_AT, ANNOTATION_WITHDRAWN};

use crate::observer::{allowed_to_run, job_controller_runs};
use crate::{Env, STEADY_ELECTION, ensure};

/// The SingletonJob of every test (each in its own namespace).
pub const SJ: &str = "prep";
/// The Lease of the rows with two replicas.
pub const LEASE: &str = "singleton-controller";
/// A finalizer of the tests', holding a Job past a delete (the controller's, or the garbage
/// collector's) until the test lets it go.
pub const HOLD: &str = "e2e.singleton.dev/hold";

/// The controllers of a test.
#[derive(Clone, Copy, Debug)]
pub enum Replicas {
    /// One, without leader election.
    One,
    /// One, without leader election (its gate always open), with the failpoint `point` armed
    /// (`action`: `stop` or `abort`).
    OneArmed {
        point: &'static str,
        action: &'static str,
    },
    /// Two with leader election ([`STEADY_ELECTION`]): replica 0 leads with the failpoint `point`
    /// armed (`action`: `stop` or `abort`), replica 1 stands by.
    Two {
        point: &'static str,
        action: &'static str,
    },
}

/// Starts the controllers of `replicas`, each with the flags `args`; returns how many. With
/// [`Replicas::Two`], once replica 0 leads, replica 1 (nothing armed) stands by; replica 0,
/// armed to `stop`, runs one worker thread (see the comment inside).
pub async fn start_replicas(env: &mut Env, replicas: Replicas, args: &[&str]) -> Result<usize> {
    let (point, action) = match replicas {
        Replicas::One => {
            env.start_controller(args).await?;
            return Ok(1);
        }
        Replicas::OneArmed { point, action } => {
            let armed = [(
                "SINGLETON_FAILPOINTS".to_string(),
                format!("{point}={action}"),
            )];
            env.start_controller_with_env(&armed, args).await?;
            return Ok(1);
        }
        Replicas::Two { point, action } => (point, action),
    };
    let elect = [STEADY_ELECTION, &["--lease-name", LEASE], args].concat();
    let mut armed = vec![(
        "SINGLETON_FAILPOINTS".to_string(),
        format!("{point}={action}"),
    )];
    if action == "stop" {
        // One worker thread. Continued (SIGCONT) past its Lease, the replica's election loop
        // finds its renew deadline passed and aborts the reconciles in flight, which drops
        // the request it froze before unless that is out already: a race. With one worker
        // the reconcile, running when it froze, mostly goes on first (its request got out in
        // 6 of 8 runs, against 1 of 4 with two workers; see tests/prepared.rs's
        // `a_resume_sent_after_the_withdrawal_mark_is_refused` for no race).
        armed.push(("TOKIO_WORKER_THREADS".to_string(), "1".to_string()));
    }
    env.start_controller_with_env(&armed, &elect).await?;
    let e = &*env;
    e.wait_for("replica 0 to lead", Duration::from_secs(30), || async {
        Ok((leader(e).await? == Some(0)).then_some(()))
    })
    .await?;
    env.start_controller(&elect).await?;
    Ok(2)
}

/// The replica (`e2e-<idx>`) the Lease names.
pub async fn leader(env: &Env) -> Result<Option<usize>> {
    env.lease_holder(LEASE).await
}

/// Whether controller `idx` logged a line containing every one of `all`.
pub fn logged(env: &Env, idx: usize, all: &[&str]) -> bool {
    env.controller_log(idx)
        .lines()
        .any(|l| all.iter().all(|x| l.contains(x)))
}

/// `result`, with what a failure needs besides [`Env`]'s dump: `run` (what the test knows of its
/// prepared run, if anything), every state `watch` saw, and the log lines of controllers
/// `0..replicas` that contain one of `about` (lower case, matched in any case): the whole logs
/// would bury them.
pub fn explained(
    result: Result<()>,
    env: &Env,
    replicas: usize,
    watch: &JobWatch,
    about: &[&str],
    run: &str,
) -> Result<()> {
    let Err(e) = result else {
        return Ok(());
    };
    let logs = controller_logs(env, replicas, about);
    Err(anyhow!("{e:#}\n{run}{}{logs}", watch.summary()))
}

/// The log lines of controllers `0..replicas` that contain one of `about` (any case).
fn controller_logs(env: &Env, replicas: usize, about: &[&str]) -> String {
    let mut logs = String::new();
    for idx in 0..replicas {
        let log = env.controller_log(idx);
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                about.iter().any(|x| l.contains(x))
            })
            .collect();
        logs += &format!(
            "---- controller {idx}'s log, lines about prepared runs, errors and warnings \
             ({} of {})\n{}\n",
            lines.len(),
            log.lines().count(),
            lines.join("\n")
        );
    }
    logs
}

/// Holds the Job `name` with uid `uid` (the finalizer [`HOLD`], written as `manager`): deleted,
/// it stays, its name taken, until [`release_job`].
pub async fn hold_job(env: &Env, name: &str, uid: &str, manager: &str) -> Result<()> {
    set_finalizers(env, name, uid, manager, serde_json::json!([HOLD])).await
}

/// Lets the Job go (no finalizer); nothing to do when it is gone: 404, or 422 when another Job
/// has its name now (the patch's uid guard refused it).
pub async fn release_job(env: &Env, name: &str, uid: &str, manager: &str) -> Result<()> {
    let gone = |s: &kube::core::Status| s.code == 404 || s.code == 422;
    match set_finalizers(env, name, uid, manager, serde_json::Value::Null).await {
        Err(e)
            if e.downcast_ref::<kube::Error>()
                .is_some_and(|k| matches!(k, kube::Error::Api(s) if gone(s))) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// A merge patch of the Job's finalizers, guarded by its uid.
async fn set_finalizers(
    env: &Env,
    name: &str,
    uid: &str,
    manager: &str,
    finalizers: serde_json::Value,
) -> Result<()> {
    let body = serde_json::json!({ "metadata": { "uid": uid, "finalizers": finalizers } });
    let pp = PatchParams {
        field_manager: Some(manager.into()),
        ..PatchParams::default()
    };
    env.jobs().patch(name, &pp, &Patch::Merge(&body)).await?;
    Ok(())
}

/// The SingletonJob's status now.
pub async fn status(env: &Env) -> Result<SingletonJobStatus> {
    Ok(env.get_sj(SJ).await?.status.unwrap_or_default())
}

/// The Job's annotation `key`.
pub fn annotation<'a>(job: &'a Job, key: &str) -> Option<&'a str> {
    job.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The Job's period (annotation `singleton.dev/period`).
pub fn period_of(job: &Job) -> Option<Timestamp> {
    annotation(job, naming::LABEL_PERIOD)?.parse().ok()
}

/// How long until `t` (zero once past).
pub fn until(t: Timestamp) -> Duration {
    Duration::try_from(t.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO)
}

/// Whether `job` is the prepared Job `uid` as it stays until its instant: suspended, `released:
/// "false"` (so neither released nor withdrawn).
pub fn held_back(job: &Job, uid: &str) -> bool {
    job.uid().as_deref() == Some(uid)
        && job.spec.as_ref().and_then(|x| x.suspend) == Some(true)
        && annotation(job, ANNOTATION_RELEASED) == Some(naming::NOT_RELEASED)
}

/// The Job `name` once it is unsuspended and released with `token` (within 30 s of `instant`),
/// checked to be the prepared Job `uid`; `verb` ("resumed", "started") names that in the
/// messages.
pub async fn released_job(
    env: &Env,
    name: &str,
    uid: &str,
    token: u64,
    instant: Timestamp,
    verb: &str,
) -> Result<Job> {
    let token = token.to_string();
    let job = env
        .wait_for(
            &format!("the prepared Job {verb}: unsuspended, released with its token"),
            until(instant) + Duration::from_secs(30),
            || async {
                let job = env.jobs().get_opt(name).await?;
                Ok(job.filter(|j| {
                    annotation(j, ANNOTATION_RELEASED) == Some(token.as_str())
                        && j.spec.as_ref().and_then(|x| x.suspend) == Some(false)
                }))
            },
        )
        .await?;
    ensure(
        env,
        job.uid().as_deref() == Some(uid),
        (
            format!("the {verb} Job is the prepared one"),
            job.uid(),
            uid,
        ),
    )
    .await?;
    Ok(job)
}

/// A withdrawn Job's `states` carry one mark: `released: withdrawn` with `withdrawn: <reason>`.
pub async fn marked_withdrawn(env: &Env, states: &[Seen], reason: &str) -> Result<()> {
    let marks: BTreeSet<(Option<String>, Option<String>)> = states
        .iter()
        .filter(|x| x.withdrawn.is_some())
        .map(|x| (x.released.clone(), x.withdrawn.clone()))
        .collect();
    ensure(
        env,
        marks == BTreeSet::from([(Some(naming::WITHDRAWN.into()), Some(reason.into()))]),
        ("the Job marked withdrawn with the reason", reason, &marks),
    )
    .await
}

/// No state of a withdrawn Job (`states`) was allowed to run.
pub async fn never_allowed_to_run(env: &Env, states: &[Seen]) -> Result<()> {
    let ran: Vec<&Seen> = states.iter().filter(|x| x.ran).collect();
    ensure(
        env,
        ran.is_empty(),
        ("the withdrawn Job never allowed to run", &ran),
    )
    .await
}

/// No pod for the withdrawn Job `uid`, by the job controller's Events: they outlive the Job and
/// a watch state that missed a pod.
pub async fn no_pod(env: &Env, uid: &str) -> Result<()> {
    let all = env.events().list(&ListParams::default()).await?.items;
    let pods = job_controller_runs(&all).remove(uid);
    ensure(
        env,
        pods.as_ref().is_none_or(|j| !j.ran),
        (
            "no pod for the withdrawn Job (job controller Events)",
            &pods,
        ),
    )
    .await
}

/// Who last set the Job's `spec.suspend`, and when, by the API server's clock (whole seconds):
/// its managedFields entry that owns the field, passing over the field manager `but` (a test's
/// own writes, such as the create of a Job it crafted suspended).
pub fn suspend_set_by(job: &Job, but: Option<&str>) -> Option<(String, Timestamp)> {
    job.metadata.managed_fields.as_ref()?.iter().find_map(|m| {
        let manager = m.manager.clone().unwrap_or_default();
        let owns = m
            .fields_v1
            .as_ref()
            .is_some_and(|f| f.0.pointer("/f:spec/f:suspend").is_some());
        if but == Some(manager.as_str()) || !owns {
            return None;
        }
        Some((manager, m.time.as_ref()?.0))
    })
}

/// One state of a Job, as the watch saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// When the watch saw it (this process's clock).
    pub at: Timestamp,
    pub uid: String,
    pub name: String,
    pub period: Option<Timestamp>,
    pub token: Option<u64>,
    pub suspend: Option<bool>,
    /// Allowed to run pods ([`allowed_to_run`]).
    pub ran: bool,
    pub released: Option<String>,
    pub withdrawn: Option<String>,
    pub resume_at: Option<Timestamp>,
    /// [`suspend_set_by`].
    pub suspend_set: Option<(String, Timestamp)>,
    pub created: Option<Timestamp>,
    pub start_time: Option<Timestamp>,
    /// The first container's command.
    pub command: Option<Vec<String>>,
    pub deleting: bool,
    /// Its deletion event.
    pub deleted: bool,
}

impl Seen {
    /// The state of `job` now; `but` as in [`suspend_set_by`].
    fn of(job: &Job, deleted: bool, but: Option<&str>) -> Option<Seen> {
        let get = |k: &str| annotation(job, k).map(String::from);
        let status = job.status.as_ref();
        Some(Seen {
            at: Timestamp::now(),
            uid: job.uid()?,
            name: job.name_any(),
            period: period_of(job),
            token: get(naming::LABEL_TOKEN).and_then(|t| t.parse().ok()),
            suspend: job.spec.as_ref().and_then(|s| s.suspend),
            ran: allowed_to_run(job),
            released: get(ANNOTATION_RELEASED),
            withdrawn: get(ANNOTATION_WITHDRAWN),
            resume_at: get(ANNOTATION_RESUME_AT).and_then(|t| t.parse().ok()),
            suspend_set: suspend_set_by(job, but),
            created: job.metadata.creation_timestamp.as_ref().map(|t| t.0),
            start_time: status.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
            command: job
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|s| s.containers.first())
                .and_then(|c| c.command.clone()),
            deleting: job.metadata.deletion_timestamp.is_some(),
            deleted,
        })
    }

    /// Marked withdrawn (either annotation).
    pub fn is_withdrawn(&self) -> bool {
        self.withdrawn.is_some() || self.released.as_deref() == Some(naming::WITHDRAWN)
    }
}

/// Every state of every Job of the namespace, in the order seen.
pub struct JobWatch {
    states: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl JobWatch {
    /// Watches the Jobs of `ns`; returns once the first list is in. `but` as in
    /// [`suspend_set_by`].
    pub async fn start(client: kube::Client, ns: &str, but: Option<&'static str>) -> Result<Self> {
        let states = Arc::new(Mutex::new(Vec::new()));
        let (synced_tx, synced) = tokio::sync::oneshot::channel();
        let api: Api<Job> = Api::namespaced(client, ns);
        let task = tokio::spawn(watch_jobs(api, states.clone(), synced_tx, but));
        tokio::time::timeout(Duration::from_secs(30), synced)
            .await
            .context("the Job watch did not sync within 30 s")??;
        Ok(JobWatch { states, task })
    }

    /// Every state seen, in the order seen.
    pub fn all(&self) -> Vec<Seen> {
        self.states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The states of the Job `uid`, in the order seen.
    pub fn states(&self, uid: &str) -> Vec<Seen> {
        self.all().into_iter().filter(|x| x.uid == uid).collect()
    }

    /// The first state seen of each Job.
    pub fn firsts(&self) -> Vec<Seen> {
        let mut seen = BTreeSet::new();
        self.all()
            .into_iter()
            .filter(|x| seen.insert(x.uid.clone()))
            .collect()
    }

    /// The uids of every Job seen for period `p`.
    pub fn uids_of(&self, p: Timestamp) -> BTreeSet<String> {
        self.all()
            .into_iter()
            .filter(|x| x.period == Some(p))
            .map(|x| x.uid)
            .collect()
    }

    /// Checks that the Jobs seen for period `p` are exactly `uids`; `what` says which those are.
    pub async fn only_seen(
        &self,
        env: &Env,
        p: Timestamp,
        uids: &[&str],
        what: &str,
    ) -> Result<()> {
        let seen = self.uids_of(p);
        let want: BTreeSet<String> = uids.iter().map(|u| u.to_string()).collect();
        ensure(env, seen == want, (what, &seen)).await
    }

    /// The uids of the Jobs seen for each period.
    pub fn uids_by_period(&self) -> BTreeMap<Timestamp, BTreeSet<String>> {
        let mut out: BTreeMap<Timestamp, BTreeSet<String>> = BTreeMap::new();
        for x in self.all() {
            if let Some(p) = x.period {
                out.entry(p).or_default().insert(x.uid);
            }
        }
        out
    }

    /// The uids of every Job ever seen allowed to run.
    pub fn ran_uids(&self) -> BTreeSet<String> {
        self.all()
            .into_iter()
            .filter(|x| x.ran)
            .map(|x| x.uid)
            .collect()
    }

    /// The uids of the Jobs of period `p` ever seen allowed to run.
    pub fn ran_uids_of(&self, p: Timestamp) -> BTreeSet<String> {
        self.all()
            .into_iter()
            .filter(|x| x.ran && x.period == Some(p))
            .map(|x| x.uid)
            .collect()
    }

    /// (period, created) of each Job that was prepared (created with `resume-at`, before its
    /// instant by the API server's whole seconds) and then ran.
    pub fn prepared_and_ran(&self) -> Vec<(Timestamp, Timestamp)> {
        let ran = self.ran_uids();
        self.firsts()
            .into_iter()
            .filter(|x| ran.contains(&x.uid))
            .filter_map(|x| match (x.period, x.created, x.resume_at) {
                (Some(p), Some(c), Some(r)) if c < r => Some((p, c)),
                _ => None,
            })
            .collect()
    }

    /// Every state seen (the last 80), for a failure report.
    pub fn summary(&self) -> String {
        let all = self.all();
        let mut out = format!(
            "---- Job watch: {} states of {} Jobs (the last 80)\n",
            all.len(),
            all.iter().map(|x| &x.uid).collect::<BTreeSet<_>>().len()
        );
        let time = |t: Option<Timestamp>| t.map(|t| t.to_string());
        for x in all.iter().skip(all.len().saturating_sub(80)) {
            out += &format!(
                "{} {} uid={} period={:?} token={:?} suspend={:?} ran={} released={:?} \
                 withdrawn={:?} resume-at={:?} suspend-set-by={:?} created={:?} \
                 startTime={:?} command={:?}{}{}\n",
                x.at,
                x.name,
                x.uid,
                time(x.period),
                x.token,
                x.suspend,
                x.ran,
                x.released,
                x.withdrawn,
                time(x.resume_at),
                x.suspend_set.as_ref().map(|(m, t)| format!("{m}@{t}")),
                time(x.created),
                time(x.start_time),
                x.command,
                if x.deleting { " deleting" } else { "" },
                if x.deleted { " DELETED" } else { "" },
            );
        }
        out
    }
}

impl Drop for JobWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Records every state of the Jobs `api` lists into `states`; `synced` once the first list is
/// in. `but` as in [`suspend_set_by`].
async fn watch_jobs(
    api: Api<Job>,
    states: Arc<Mutex<Vec<Seen>>>,
    synced: tokio::sync::oneshot::Sender<()>,
    but: Option<&str>,
) {
    let mut synced = Some(synced);
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    let record = |job: &Job, deleted: bool| {
        if let Some(x) = Seen::of(job, deleted, but) {
            states
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(x);
        }
    };
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::InitApply(job) | watcher::Event::Apply(job)) => record(&job, false),
            Ok(watcher::Event::Delete(job)) => record(&job, true),
            Ok(watcher::Event::InitDone) => {
                if let Some(tx) = synced.take() {
                    let _ = tx.send(());
                }
            }
            Ok(watcher::Event::Init) => {}
            // Retried by the watcher; a pause keeps an error from spinning.
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
