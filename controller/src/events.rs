//! Events for humans, one per state change they care about. Nobody waits on an Event: each goes
//! in the background lane, and a failure to publish one is logged, never an error.

use kube::Client;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::api::{HistoryEntry, Outcome, RunRef, SingletonJob};
use crate::lanes::{Lane, Lanes};
use crate::naming;

/// Events for humans, one per state change they care about.
pub struct Events {
    client: Client,
    reporter: Reporter,
    /// Nobody waits on an Event: they go in the background lane.
    lanes: Lanes,
}

impl Events {
    pub fn new(client: Client, reporter: Reporter, lanes: Lanes) -> Self {
        Events {
            client,
            reporter,
            lanes,
        }
    }

    pub async fn publish(
        &self,
        sj: &SingletonJob,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        self.send(sj, ev).await;
    }

    /// Publishes one Event, logging a failure (an Event is for humans; nothing waits on it).
    fn send(
        &self,
        sj: &SingletonJob,
        mut ev: Event,
    ) -> impl std::future::Future<Output = ()> + use<> {
        // Notes quote what clients wrote (who asked, why): never with control characters.
        ev.note = ev.note.map(|n| crate::text::printable(&n));
        // A Recorder per Event: kube's Recorder folds Events with the same reason into one
        // series keeping the first note, which would show the first run's Job and token, or the
        // first break-lock's who and why, for every later one. Ours differ in their notes and
        // are rate-limited by the state changes that cause them.
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        let reference = sj.object_ref(&());
        let key = sj.key();
        let lanes = self.lanes.clone();
        async move {
            let sent = lanes.run(Lane::Background, || recorder.publish(&ev, &reference));
            if let Err(e) = sent.await {
                tracing::warn!(sj = %key, error = %e, "could not publish event");
            }
        }
    }

    /// RunStarted, published by a task of its own: awaited, its request would sit between a run's
    /// Job creation and its confirm.
    pub fn run_started(&self, sj: &SingletonJob, run: &RunRef) {
        let note = format!(
            "Created Job {} for period {} with fencing token {}",
            run.job_name,
            naming::period_rfc3339(run.period.0),
            run.token
        );
        let ev = Event {
            type_: EventType::Normal,
            reason: "RunStarted".into(),
            note: Some(note),
            action: "StartRun".into(),
            secondary: None,
        };
        tokio::spawn(self.send(sj, ev));
    }

    pub async fn recorded(&self, sj: &SingletonJob, e: &HistoryEntry) {
        let type_ = match e.outcome {
            Outcome::Succeeded | Outcome::Running => EventType::Normal,
            _ => EventType::Warning,
        };
        let what = match (&e.job_name, e.count) {
            (Some(job), _) => format!("Job {job} (token {})", e.token.unwrap_or_default()),
            (None, 1) => "period".to_string(),
            (None, n) => format!(
                "{n} periods through {}",
                e.last_period
                    .as_ref()
                    .map(|t| naming::period_rfc3339(t.0))
                    .unwrap_or_default()
            ),
        };
        let note = format!(
            "{what} from {} {}{}",
            naming::period_rfc3339(e.period.0),
            e.outcome.name(),
            e.reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        );
        self.publish(
            sj,
            type_,
            &format!("Run{}", e.outcome.name()),
            "RecordOutcome",
            note,
        )
        .await;
    }
}
