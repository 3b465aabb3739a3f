//! The outside observer of Jobs: a watch of the scenario's namespace (Jobs labelled
//! `singleton.dev/job`), started before the first run, that keeps every Job it ever saw by uid,
//! with whether it was ever allowed to run pods and when it went away. Listing Jobs at the end
//! misses what history pruning, a Replace or a deletion removed; a watch sees each Job's whole
//! life, including one that existed for a moment.
//!
//! Where a watch cannot promise that: after `410 Gone` (the API server's watch cache no longer
//! holds the resourceVersion it resumes from, as after an API server or etcd restart) the watcher
//! lists again, and a Job created and removed between the last event and that list is never seen.
//! The observer counts those relists, marks Jobs that vanished across one, and
//! [`job_controller_runs`] cross-checks with the job controller's Events, which outlive the Job
//! (one hour by default) and name its uid: a Job that got a pod escapes both only if its Events
//! were dropped (the recorder sheds them under extreme load) or expired. The API server's audit
//! log would see every request, but it needs flags on the API server that the cluster `make e2e`
//! shares with the other tests does not have.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Event;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use singleton::naming;
use tokio::sync::mpsc;

/// One Job as the observer saw it, by uid.
#[derive(Clone, Debug)]
pub struct JobRecord {
    pub uid: String,
    pub name: String,
    /// Annotation `singleton.dev/job`: the SingletonJob's name.
    pub sj: Option<String>,
    /// Annotation `singleton.dev/period`.
    pub period: Option<Timestamp>,
    /// Annotation `singleton.dev/fencing-token`.
    pub token: Option<u64>,
    /// Ever seen allowed to run pods (see [`allowed_to_run`]).
    pub ran: bool,
    /// When the watch first saw it allowed to run (the watch's time).
    pub ran_at: Option<Timestamp>,
    /// Seen allowed to run while its `singleton.dev/released` annotation still said `false`:
    /// someone other than the controller started it (issue 31).
    pub ran_unreleased: bool,
    /// When it was released (allowed to run), by the API server's clock in whole seconds: the
    /// `managedFields` time of the update that set `spec.suspend: false`, read from the first
    /// state seen allowed to run ([`released_at`]). None: never seen released, or that state
    /// carried no such entry.
    pub released_at: Option<Timestamp>,
    /// Annotation `singleton.dev/resume-at`: a prepared run's Job (issue 33), created ahead of
    /// its instant and resumed at it.
    pub resume_at: Option<Timestamp>,
    /// Ever seen marked withdrawn (`singleton.dev/released: withdrawn`): the reason its
    /// `singleton.dev/withdrawn` annotation gave (empty if none).
    pub withdrawn: Option<String>,
    /// The first container's command and arguments, space-joined: which template it was built
    /// from.
    pub command: Option<String>,
    /// Seen Complete or Failed.
    pub finished: bool,
    /// When the observer first saw it Complete or Failed (the watch's time).
    pub finished_at: Option<Timestamp>,
    pub created: Option<Timestamp>,
    /// When the observer saw it go.
    pub deleted: Option<Timestamp>,
    /// Its removal was inferred from a relist that no longer had it, not seen as an event.
    pub deleted_in_gap: bool,
}

/// What the workload hears of the Jobs.
#[derive(Clone, Debug)]
pub enum Seen {
    /// A Job was seen allowed to run for the first time: its pod starts.
    Ran {
        uid: String,
        sj: String,
        period: Timestamp,
        token: u64,
    },
    /// A Job left the API server: its pods die.
    Gone { uid: String },
}

#[derive(Default)]
struct State {
    jobs: BTreeMap<String, JobRecord>,
    /// Complete lists received (the first, then one per relist).
    lists: u64,
    errors: u64,
    last_error: Option<String>,
}

pub struct Observer {
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

/// Allowed to run pods: `spec.suspend` not true, or evidence of pods (`status.startTime`, a pod
/// count). A Job created suspended and never resumed shows neither.
pub fn allowed_to_run(job: &Job) -> bool {
    let unsuspended = job.spec.as_ref().is_none_or(|s| s.suspend != Some(true));
    let pods = job.status.as_ref().is_some_and(|s| {
        s.start_time.is_some()
            || [s.active, s.ready, s.succeeded, s.failed, s.terminating]
                .iter()
                .any(|n| n.unwrap_or(0) > 0)
            || s.uncounted_terminated_pods.as_ref().is_some_and(|u| {
                u.succeeded.as_ref().is_some_and(|v| !v.is_empty())
                    || u.failed.as_ref().is_some_and(|v| !v.is_empty())
            })
    });
    unsuspended || pods
}

/// When `job` was let run, by the API server's clock (whole seconds, rounded down): the time of
/// the `managedFields` entry that owns `spec.suspend` (the main resource, not a subresource),
/// taken from a state in which `spec.suspend` is false. Whoever cleared `spec.suspend` (the
/// controller's resume, or someone else) owns the field from that update on, and the entry's
/// time is that update's, until the same manager updates the Job again: read from the first
/// state the watch sees released, it is the resume's own time. None while suspended (a Job that
/// ran with `spec.suspend` still true has no release time) or without such an entry.
pub fn released_at(job: &Job) -> Option<Timestamp> {
    if job.spec.as_ref().is_some_and(|s| s.suspend == Some(true)) {
        return None;
    }
    job.metadata
        .managed_fields
        .as_ref()?
        .iter()
        .filter(|m| m.subresource.as_deref().unwrap_or_default().is_empty())
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:suspend").is_some())
        })
        .filter_map(|m| Some(m.time.as_ref()?.0))
        .max()
}

/// The first container's command and arguments, space-joined.
fn command_of(job: &Job) -> Option<String> {
    let c = job
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?;
    let words: Vec<&str> = c
        .command
        .iter()
        .chain(c.args.iter())
        .flatten()
        .map(String::as_str)
        .collect();
    Some(words.join(" "))
}

fn finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Observer {
    /// Starts watching `ns`; what it sees of runs goes to `tx` as well.
    pub fn start(client: Client, ns: &str, tx: mpsc::UnboundedSender<Seen>) -> Observer {
        let state = Arc::new(Mutex::new(State::default()));
        let api: Api<Job> = Api::namespaced(client, ns);
        let task = tokio::spawn(watch(api, state.clone(), tx));
        Observer { state, task }
    }

    /// Starts watching `ns` for a test that only reads what was seen; returns once the first
    /// list is in (every Job created from now on is seen).
    pub async fn watch(client: Client, ns: &str) -> anyhow::Result<Observer> {
        let (tx, _) = mpsc::unbounded_channel();
        let observer = Observer::start(client, ns, tx);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !observer.synced() {
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("the Job watch of {ns} did not sync within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(observer)
    }

    /// The periods with more than one Job that ran, per (SingletonJob, period): a second run
    /// (G1 broken), as users count runs.
    pub fn second_runs(&self) -> Vec<Vec<JobRecord>> {
        let mut by_period: BTreeMap<(Option<String>, Timestamp), Vec<JobRecord>> = BTreeMap::new();
        for j in self.jobs() {
            if let (true, Some(p)) = (j.ran, j.period) {
                by_period.entry((j.sj.clone(), p)).or_default().push(j);
            }
        }
        by_period.into_values().filter(|js| js.len() > 1).collect()
    }

    /// The first complete list has arrived: from now on every Job created is seen.
    pub fn synced(&self) -> bool {
        lock(&self.state).lists > 0
    }

    /// Every Job seen so far.
    pub fn jobs(&self) -> Vec<JobRecord> {
        lock(&self.state).jobs.values().cloned().collect()
    }

    /// Lists after the first: each one a gap in which a short-lived Job may have gone unseen.
    pub fn relists(&self) -> u64 {
        lock(&self.state).lists.saturating_sub(1)
    }

    /// Errors of the watch so far (each retried; a relist only after 410 Gone).
    pub fn errors(&self) -> u64 {
        lock(&self.state).errors
    }

    /// What it saw, for a failure report: counts and the 40 newest Jobs.
    pub fn summary(&self) -> String {
        let s = lock(&self.state);
        let mut jobs: Vec<&JobRecord> = s.jobs.values().collect();
        jobs.sort_by_key(|j| j.created);
        let mut out = format!(
            "---- Job watch: {} Jobs seen, {} ran, {} lists, {} errors (last: {:?})\n",
            jobs.len(),
            jobs.iter().filter(|j| j.ran).count(),
            s.lists,
            s.errors,
            s.last_error
        );
        for j in jobs.iter().rev().take(40).rev() {
            out += &format!(
                "{} uid={} token={:?} ran={} finished={} created={:?} released={:?} resume_at={:?} withdrawn={:?} deleted={:?}{}\n",
                j.name,
                j.uid,
                j.token,
                j.ran,
                j.finished,
                j.created.map(|t| t.to_string()),
                j.released_at.map(|t| t.to_string()),
                j.resume_at.map(|t| t.to_string()),
                j.withdrawn,
                j.deleted.map(|t| t.to_string()),
                if j.deleted_in_gap { " (in a gap)" } else { "" }
            );
        }
        out
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The watch loop. kube's watcher resumes from the last resourceVersion after an error and lists
/// again only on 410 Gone; errors are retried every 200 ms (not kube's back-off of up to 30 s,
/// which would widen a gap after an API server restart).
async fn watch(api: Api<Job>, state: Arc<Mutex<State>>, tx: mpsc::UnboundedSender<Seen>) {
    let cfg = watcher::Config::default().labels("singleton.dev/job");
    let mut stream = watcher(api, cfg).boxed();
    let mut listing: Option<HashSet<String>> = None;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Init) => listing = Some(HashSet::new()),
            Ok(watcher::Event::InitApply(job)) => {
                if let (Some(l), Some(uid)) = (listing.as_mut(), job.uid()) {
                    l.insert(uid);
                }
                apply(&state, &tx, &job);
            }
            Ok(watcher::Event::InitDone) => {
                let listed = listing.take().unwrap_or_default();
                let now = Timestamp::now();
                let mut s = lock(&state);
                s.lists += 1;
                // Known, not gone, and not in the new list: removed while the watch was down.
                for r in s.jobs.values_mut() {
                    if r.deleted.is_none() && !listed.contains(&r.uid) {
                        r.deleted = Some(now);
                        r.deleted_in_gap = true;
                        let _ = tx.send(Seen::Gone { uid: r.uid.clone() });
                    }
                }
            }
            Ok(watcher::Event::Apply(job)) => apply(&state, &tx, &job),
            Ok(watcher::Event::Delete(job)) => {
                apply(&state, &tx, &job);
                if let Some(uid) = job.uid() {
                    let mut s = lock(&state);
                    if let Some(r) = s.jobs.get_mut(&uid)
                        && r.deleted.is_none()
                    {
                        r.deleted = Some(Timestamp::now());
                        let _ = tx.send(Seen::Gone { uid });
                    }
                }
            }
            Err(e) => {
                {
                    let mut s = lock(&state);
                    s.errors += 1;
                    s.last_error = Some(e.to_string());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Records one state of a Job; the first state allowed to run is announced.
fn apply(state: &Mutex<State>, tx: &mpsc::UnboundedSender<Seen>, job: &Job) {
    let Some(uid) = job.uid() else { return };
    let a = job.annotations();
    let mut s = lock(state);
    let r = s.jobs.entry(uid.clone()).or_insert_with(|| JobRecord {
        uid: uid.clone(),
        name: job.name_any(),
        sj: a.get("singleton.dev/job").cloned(),
        period: a.get("singleton.dev/period").and_then(|p| p.parse().ok()),
        token: a
            .get("singleton.dev/fencing-token")
            .and_then(|t| t.parse().ok()),
        ran: false,
        ran_at: None,
        ran_unreleased: false,
        released_at: None,
        resume_at: a
            .get(naming::ANNOTATION_RESUME_AT)
            .and_then(|t| t.parse().ok()),
        withdrawn: None,
        command: command_of(job),
        finished: false,
        finished_at: None,
        created: job.metadata.creation_timestamp.as_ref().map(|t| t.0),
        deleted: None,
        deleted_in_gap: false,
    });
    if !r.finished && finished(job) {
        r.finished = true;
        r.finished_at = Some(Timestamp::now());
    }
    let released = a.get(naming::ANNOTATION_RELEASED).map(String::as_str);
    r.ran_unreleased |= allowed_to_run(job) && released == Some(naming::NOT_RELEASED);
    if r.withdrawn.is_none() && released == Some(naming::WITHDRAWN) {
        let why = a.get(naming::ANNOTATION_WITHDRAWN).cloned();
        r.withdrawn = Some(why.unwrap_or_default());
    }
    if !r.ran && allowed_to_run(job) {
        r.ran = true;
        r.ran_at = Some(Timestamp::now());
        r.released_at = released_at(job);
        if let (Some(sj), Some(period), Some(token)) = (r.sj.clone(), r.period, r.token) {
            let _ = tx.send(Seen::Ran {
                uid,
                sj,
                period,
                token,
            });
        }
    }
}

/// A Job as the job controller's Events tell of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventJob {
    pub name: String,
    /// An Event other than `Suspended` (a pod created or deleted, the Job resumed, completed,
    /// failed): the Job was allowed to run pods.
    pub ran: bool,
}

/// The Jobs the job controller (kube-controller-manager) reported on, by uid: a second witness,
/// kept in etcd after the Job is gone and across API server restarts.
pub fn job_controller_runs(events: &[Event]) -> BTreeMap<String, EventJob> {
    let mut out: BTreeMap<String, EventJob> = BTreeMap::new();
    for e in events {
        let o = &e.involved_object;
        let by_job_controller = e.source.as_ref().and_then(|s| s.component.as_deref())
            == Some("job-controller")
            || e.reporting_component.as_deref() == Some("job-controller");
        if o.kind.as_deref() != Some("Job") || !by_job_controller {
            continue;
        }
        let (Some(uid), Some(name)) = (o.uid.clone(), o.name.clone()) else {
            continue;
        };
        let ran = e.reason.as_deref() != Some("Suspended");
        out.entry(uid)
            .and_modify(|j| j.ran |= ran)
            .or_insert(EventJob { name, ran });
    }
    out
}

/// The SingletonJob name and period of a scheduled run's Job name, `<name>-<unix seconds>`.
pub fn parse_job_name(name: &str) -> Option<(&str, Timestamp)> {
    let (sj, secs) = name.rsplit_once('-')?;
    let period = Timestamp::from_second(secs.parse().ok()?).ok()?;
    Some((sj, period))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{JobSpec, JobStatus};
    use k8s_openapi::api::core::v1::{EventSource, ObjectReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};

    fn job(suspend: Option<bool>, status: Option<JobStatus>) -> Job {
        Job {
            spec: Some(JobSpec {
                suspend,
                ..JobSpec::default()
            }),
            status,
            ..Job::default()
        }
    }

    #[test]
    fn a_suspended_job_without_pods_has_not_run() {
        assert!(!allowed_to_run(&job(Some(true), None)));
        assert!(allowed_to_run(&job(None, None)));
        assert!(allowed_to_run(&job(Some(false), None)));
        // Suspended again after running: its pods ran.
        let ran = JobStatus {
            succeeded: Some(1),
            ..JobStatus::default()
        };
        assert!(allowed_to_run(&job(Some(true), Some(ran))));
    }

    fn entry(
        manager: &str,
        fields: serde_json::Value,
        secs: i64,
        sub: Option<&str>,
    ) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Update".into()),
            fields_v1: Some(FieldsV1(fields)),
            subresource: sub.map(String::from),
            time: Some(Time(Timestamp::from_second(1_800_000_000 + secs).unwrap())),
            ..ManagedFieldsEntry::default()
        }
    }

    #[test]
    fn a_job_is_released_when_the_owner_of_spec_suspend_last_wrote_it() {
        let mut j = job(Some(false), None);
        let suspend = serde_json::json!({"f:spec": {"f:suspend": {}}});
        let labels = serde_json::json!({"f:metadata": {"f:labels": {}}});
        j.metadata.managed_fields = Some(vec![
            entry("kube-controller-manager", labels, 9, None),
            entry("singleton-controller", suspend.clone(), 5, None),
            // The job controller's status writes (a subresource) say nothing of the release.
            entry("kube-controller-manager", suspend, 7, Some("status")),
        ]);
        assert_eq!(
            released_at(&j),
            Some(Timestamp::from_second(1_800_000_005).unwrap())
        );
        // Still suspended: not released, whatever the entries say.
        j.spec.as_mut().unwrap().suspend = Some(true);
        assert_eq!(released_at(&j), None);
        // No entry owns spec.suspend: unknown.
        let mut bare = job(None, None);
        bare.metadata.managed_fields = Some(vec![]);
        assert_eq!(released_at(&bare), None);
    }

    fn event(uid: &str, reason: &str, component: &str) -> Event {
        Event {
            involved_object: ObjectReference {
                kind: Some("Job".into()),
                name: Some(format!("a-{uid}")),
                uid: Some(uid.into()),
                ..ObjectReference::default()
            },
            reason: Some(reason.into()),
            source: Some(EventSource {
                component: Some(component.into()),
                host: None,
            }),
            ..Event::default()
        }
    }

    #[test]
    fn the_job_controller_events_tell_which_jobs_ran() {
        let evs = [
            event("1", "SuccessfulCreate", "job-controller"),
            event("2", "Suspended", "job-controller"),
            event("3", "Suspended", "job-controller"),
            event("3", "Resumed", "job-controller"),
            event("4", "SuccessfulCreate", "someone-else"),
        ];
        let runs = job_controller_runs(&evs);
        let ran: Vec<(&str, bool)> = runs.iter().map(|(u, j)| (u.as_str(), j.ran)).collect();
        assert_eq!(ran, vec![("1", true), ("2", false), ("3", true)]);
    }

    #[test]
    fn job_names_give_their_singletonjob_and_period() {
        assert_eq!(
            parse_job_name("b-017-1800000000"),
            Some(("b-017", Timestamp::from_second(1_800_000_000).unwrap()))
        );
        assert_eq!(parse_job_name("nodash"), None);
    }
}
