//! Pods for tests on kwok, where no process runs (issue 31): each Job the watch sees allowed to
//! run starts a simulated pod that registers as its run's attempt (`<p>attempt`, attempt
//! `sim-<Job uid>`) and commits one fenced write with the three-argument fence, as the billing
//! workload does. Afterwards the database's rows say how many attempts committed per period and
//! whether two overlapped ([`crate::chaos::check::judge_attempts`], the chaos table's columns).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Result, bail};
use kube::Client;
use tokio::sync::mpsc;

use crate::chaos::check::{AttemptVerdict, WriteResult, judge_attempts};
use crate::chaos::world::{
    committed_attempts, create_writes_table, register_with_retry, write_with_retry,
};
use crate::observer::{Observer, Seen};

/// The watch of a namespace's Jobs and the pods it starts.
pub struct SimulatedPods {
    pub watch: Observer,
    prefix: String,
    started: Arc<AtomicUsize>,
    ended: Arc<AtomicUsize>,
    committed: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl SimulatedPods {
    /// Watches `ns` (returns once the first list is in) and starts a pod for every Job seen
    /// allowed to run; their writes go to the `<prefix>chaos_writes` table.
    pub async fn start(client: Client, ns: &str, prefix: &str) -> Result<SimulatedPods> {
        create_writes_table(&crate::pg().await?, prefix).await?;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let watch = Observer::start(client, ns, tx);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !watch.synced() {
            if tokio::time::Instant::now() > deadline {
                bail!("the Job watch of {ns} did not sync within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let started: Arc<AtomicUsize> = Arc::default();
        let ended: Arc<AtomicUsize> = Arc::default();
        let committed: Arc<AtomicUsize> = Arc::default();
        let counts = (
            Arc::clone(&started),
            Arc::clone(&ended),
            Arc::clone(&committed),
        );
        let (ns, p) = (ns.to_string(), prefix.to_string());
        let task = tokio::spawn(async move {
            while let Some(seen) = rx.recv().await {
                let Seen::Ran {
                    uid,
                    sj,
                    period,
                    token,
                } = seen
                else {
                    continue;
                };
                let (key, p) = (format!("{ns}/{sj}"), p.clone());
                let (started, ended, committed) =
                    (counts.0.clone(), counts.1.clone(), counts.2.clone());
                started.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let attempt = format!("sim-{uid}");
                    if register_with_retry(&p, &key, token, &attempt).await.is_ok()
                        && let WriteResult::Accepted { .. } =
                            write_with_retry(&p, &key, period, token, false, Some(&attempt)).await
                    {
                        committed.fetch_add(1, Ordering::SeqCst);
                    }
                    ended.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        Ok(SimulatedPods {
            watch,
            prefix: prefix.to_string(),
            started,
            ended,
            committed,
            task,
        })
    }

    /// Once every pod started has ended (given 30 s): the attempts that committed, judged, and
    /// how many pods started and committed.
    pub async fn verdict(&self) -> Result<(AttemptVerdict, usize, usize)> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.ended.load(Ordering::SeqCst) < self.started.load(Ordering::SeqCst) {
            if tokio::time::Instant::now() > deadline {
                bail!("simulated pods still writing after 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let attempts = committed_attempts(&crate::pg().await?, &self.prefix).await?;
        Ok((
            judge_attempts(&attempts),
            self.started.load(Ordering::SeqCst),
            self.committed.load(Ordering::SeqCst),
        ))
    }
}

impl Drop for SimulatedPods {
    fn drop(&mut self) {
        self.task.abort();
    }
}
