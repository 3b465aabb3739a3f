//! An outside observer of a namespace's run Jobs: a watch started before the first run records
//! every Job object (by uid) the controllers ever created, and whether it was ever allowed to run
//! pods. G1 is counted as users count it (DESIGN.md): Jobs of a period, by uid, that ran. A Job
//! created suspended and deleted before it was resumed never ran.
//!
//! A watch sees every change of an object that lives longer than one event; a Job created and
//! deleted between two relists after a watch error could be missed, so [`JobWatch::restarts`]
//! says whether that ever happened (tests then fail rather than pass on a partial record).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Result;
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;
use kube::runtime::watcher;

/// What was seen of one Job object.
#[derive(Clone, Debug, PartialEq)]
pub struct SeenJob {
    pub uid: String,
    pub name: String,
    /// `namespace/name` of its SingletonJob (annotation `singleton.dev/job`, the name).
    pub sj: String,
    pub period: Option<Timestamp>,
    pub token: Option<u64>,
    /// Ever seen allowed to run: `spec.suspend` not true, a start time, or pods.
    pub ran: bool,
    /// Its delete was seen.
    pub deleted: bool,
}

/// The watch; it stops when dropped.
pub struct JobWatch {
    seen: Arc<Mutex<BTreeMap<String, SeenJob>>>,
    restarts: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for JobWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether `job` may run (or ran) pods, as far as this one view of it says.
fn allowed_to_run(job: &Job) -> bool {
    let suspended = job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false);
    let status = job.status.as_ref();
    let pods = status.map_or(0, |s| {
        s.active.unwrap_or(0) + s.succeeded.unwrap_or(0) + s.failed.unwrap_or(0)
    });
    !suspended || status.is_some_and(|s| s.start_time.is_some()) || pods > 0
}

fn record(seen: &Mutex<BTreeMap<String, SeenJob>>, job: &Job, deleted: bool) {
    let Some(uid) = job.metadata.uid.clone() else {
        return;
    };
    let ann = job.metadata.annotations.clone().unwrap_or_default();
    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    let entry = seen.entry(uid.clone()).or_insert_with(|| SeenJob {
        uid,
        name: job.metadata.name.clone().unwrap_or_default(),
        sj: format!(
            "{}/{}",
            job.metadata.namespace.clone().unwrap_or_default(),
            ann.get("singleton.dev/job").cloned().unwrap_or_default()
        ),
        period: ann.get("singleton.dev/period").and_then(|p| p.parse().ok()),
        token: ann
            .get("singleton.dev/fencing-token")
            .and_then(|t| t.parse().ok()),
        ran: false,
        deleted: false,
    });
    entry.ran |= allowed_to_run(job);
    entry.deleted |= deleted;
}

impl JobWatch {
    /// Starts watching the run Jobs of namespace `ns`; returns once the initial list is in.
    pub async fn start(client: kube::Client, ns: &str) -> Result<JobWatch> {
        let api: Api<Job> = Api::namespaced(client, ns);
        let seen: Arc<Mutex<BTreeMap<String, SeenJob>>> = Arc::default();
        let restarts = Arc::new(AtomicUsize::new(0));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (s, r) = (seen.clone(), restarts.clone());
        let cfg = watcher::Config::default().labels("singleton.dev/job");
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut stream = watcher(api, cfg).boxed();
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job)) => {
                        record(&s, &job, false)
                    }
                    Ok(watcher::Event::Delete(job)) => record(&s, &job, true),
                    Ok(watcher::Event::Init) => {
                        // A relist after the first: objects may have come and gone unseen.
                        if ready.is_none() {
                            r.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                    Err(_) => {
                        r.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    }
                }
            }
        });
        ready_rx.await?;
        Ok(JobWatch {
            seen,
            restarts,
            task,
        })
    }

    /// Every Job seen so far.
    pub fn jobs(&self) -> Vec<SeenJob> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// How often the watch had to start over (0: nothing can have been missed).
    pub fn restarts(&self) -> usize {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Per (SingletonJob, period): the Jobs that ran. G1 holds when each has at most one.
    pub fn ran_by_period(&self) -> BTreeMap<(String, Timestamp), Vec<SeenJob>> {
        let mut out: BTreeMap<(String, Timestamp), Vec<SeenJob>> = BTreeMap::new();
        for j in self.jobs() {
            if let (true, Some(p)) = (j.ran, j.period) {
                out.entry((j.sj.clone(), p)).or_default().push(j);
            }
        }
        out
    }

    /// The periods with more than one Job that ran (a second run: G1 broken).
    pub fn second_runs(&self) -> Vec<Vec<SeenJob>> {
        self.ran_by_period()
            .into_values()
            .filter(|jobs| jobs.len() > 1)
            .collect()
    }
}
