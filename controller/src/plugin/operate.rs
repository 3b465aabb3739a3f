//! Asking for an operation (trigger, backfill, break-lock, rerun): the plugin only asks. It builds the
//! request, writes it into the SingletonJob's annotation and waits for the controller to record
//! what it did in `status.operations` (the controller's side is [`crate::decide::ops`]).

use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::client::Cluster;
use super::error::PluginError;
use crate::api::{OperationPhase, OperationStatus, RepairOnly, RepairOrder, SingletonJob};
use crate::decide::ops::{self, OperationKind, Request};

/// How long an operation command waits, and for what.
#[derive(Clone, Copy, Debug)]
pub struct Wait {
    /// Give up after this long.
    pub timeout: Duration,
    /// Backfill: wait until the whole range is done, not only until it is accepted.
    pub until_done: bool,
}

/// A new request: its id is the time of asking, with microseconds.
pub fn new_request(by: Option<String>, now: Timestamp) -> Request {
    Request {
        id: crate::naming::period_rfc3339(crate::naming::manual_period(now)),
        by,
        ..Request::default()
    }
}

impl Cluster {
    /// A trigger, asked by whoever the API server says we are.
    pub async fn trigger_request(&self, now: Timestamp) -> Request {
        new_request(self.whoami().await, now)
    }

    /// A backfill of the periods from `from` to `to`, inclusive. A range that ends before it
    /// starts is a usage error, found before the cluster is asked anything.
    pub async fn backfill_request(
        &self,
        from: Timestamp,
        to: Timestamp,
        before_creation: bool,
        now: Timestamp,
    ) -> Result<Request, PluginError> {
        if from > to {
            return Err(PluginError::Usage(format!(
                "--from {from} is after --to {to}"
            )));
        }
        let mut req = new_request(self.whoami().await, now);
        req.from = Some(from);
        req.to = Some(to);
        req.before_creation = before_creation;
        Ok(req)
    }

    /// A rerun of `period`; with `replace`, a run of the period still active is fenced and
    /// deleted first instead of the rerun being refused. Whether the period may be re-run is the
    /// controller's to judge (it knows the period's records); the plugin only asks.
    pub async fn rerun_request(&self, period: Timestamp, replace: bool, now: Timestamp) -> Request {
        let mut req = new_request(self.whoami().await, now);
        req.period = Some(period);
        req.replace = replace;
        req
    }

    /// A repair of the range `from`..=`to` (or its dry run: the controller answers what it would
    /// re-run). Usage errors are found before the cluster is asked anything.
    pub async fn repair_request(
        &self,
        range: (Timestamp, Timestamp),
        only: RepairOnly,
        order: RepairOrder,
        parallel: u32,
        now: Timestamp,
    ) -> Result<Request, PluginError> {
        let (from, to) = range;
        if from > to {
            return Err(PluginError::Usage(format!(
                "--from {from} is after --to {to}"
            )));
        }
        let max = crate::decide::repair::MAX_PARALLEL;
        if !(1..=max).contains(&parallel) {
            return Err(PluginError::Usage(format!(
                "--parallel must be 1 to {max}, not {parallel}"
            )));
        }
        let mut req = new_request(self.whoami().await, now);
        req.from = Some(from);
        req.to = Some(to);
        req.only = Some(only);
        req.order = Some(order);
        req.parallel = Some(parallel);
        Ok(req)
    }

    /// A break-lock. It must say why: the reason is recorded in status and in the LockBroken
    /// Event, for whoever finds the run stopped.
    pub async fn break_lock_request(
        &self,
        reason: String,
        now: Timestamp,
    ) -> Result<Request, PluginError> {
        if reason.trim().is_empty() {
            return Err(PluginError::Usage(
                "--reason must say why the lock is broken".into(),
            ));
        }
        let mut req = new_request(self.whoami().await, now);
        req.reason = Some(reason);
        Ok(req)
    }
}

/// How often a request is written before a conflict is given up on: the controller writes the
/// status all the time, which changes the resourceVersion the write is guarded by.
const WRITE_TRIES: u32 = 5;

/// How often the status is read while waiting for the controller's record.
const POLL_INTERVAL: Duration = Duration::from_millis(250);

impl Cluster {
    /// Asks the controller for an operation: writes `req` into its annotation (guarded by the
    /// object's resourceVersion, so a concurrent request is never overwritten unseen), then polls
    /// `status.operations` until the controller records it. Returns the record.
    pub async fn operate(
        &self,
        ns: &str,
        name: &str,
        kind: OperationKind,
        req: Request,
        wait: Wait,
    ) -> Result<OperationStatus, PluginError> {
        self.write_request(ns, name, kind, &req).await?;
        self.wait_for_record(ns, name, kind, &req.id, wait).await
    }

    /// Writes `req` into `kind`'s annotation if it may be asked (see [`check_may_ask`]); after a
    /// conflict, reads, checks and writes again.
    async fn write_request(
        &self,
        ns: &str,
        name: &str,
        kind: OperationKind,
        req: &Request,
    ) -> Result<(), PluginError> {
        let api: Api<SingletonJob> = Api::namespaced(self.client.clone(), ns);
        let mut tries = 0;
        loop {
            tries += 1;
            let sj = self.get(ns, name).await?;
            check_may_ask(&sj, kind)?;
            let patch = request_patch(&sj, kind, req)?;
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 && tries < WRITE_TRIES => continue,
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    return Err(PluginError::NotFound {
                        namespace: ns.into(),
                        name: name.into(),
                    });
                }
                Err(e) => return Err(self.api_error(e, "patch", Some(ns))),
            }
        }
    }

    /// Reads the status until the controller's record of request `id` ends the wait (see
    /// [`finished`]). At the deadline: the record as it stands, or that nobody acted.
    async fn wait_for_record(
        &self,
        ns: &str,
        name: &str,
        kind: OperationKind,
        id: &str,
        wait: Wait,
    ) -> Result<OperationStatus, PluginError> {
        let deadline = tokio::time::Instant::now() + wait.timeout;
        let mut seen: Option<OperationStatus> = None;
        loop {
            let sj = self.get(ns, name).await?;
            let op = record_of(&sj, kind, id);
            if let Some(op) = &op
                && finished(op, kind, wait)?
            {
                return Ok(op.clone());
            }
            seen = op.or(seen);
            if tokio::time::Instant::now() >= deadline {
                // Accepted and waiting (for a run to finish, the clock, the backstop): the
                // controller carries it out; the record says what it waits for.
                return seen.ok_or_else(|| no_controller(kind, ns, name, wait.timeout));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

/// Whether `kind` may be asked of `sj` now: no unfinished request of its kind is overwritten, and
/// a backfill has the backstop it needs.
fn check_may_ask(sj: &SingletonJob, kind: OperationKind) -> Result<(), PluginError> {
    check_not_busy(sj, kind)?;
    let ranged = matches!(
        kind,
        OperationKind::Backfill | OperationKind::Repair | OperationKind::RepairDryRun
    );
    if ranged && sj.spec.backstop.is_none() {
        return Err(PluginError::Rejected {
            command: kind.command(),
            message: format!(
                "{} needs spec.backstop: only the backstop's claims table remembers every period that ever ran",
                kind.command()
            ),
        });
    }
    Ok(())
}

/// Refuses to overwrite a request of the same kind the controller has not finished with.
fn check_not_busy(sj: &SingletonJob, kind: OperationKind) -> Result<(), PluginError> {
    let ns = sj.namespace().unwrap_or_default();
    let name = sj.name_any();
    let busy = |id: String, state: String| {
        PluginError::Busy(format!(
            "a {cmd} request ({id}) on {ns}/{name} is not finished: {state}; wait for it (kubectl singleton status {name} -n {ns}) or withdraw it: kubectl annotate singletonjob {name} -n {ns} {key}-",
            cmd = kind.command(),
            key = kind.annotation(),
        ))
    };
    let recorded = sj.status.as_ref().and_then(|s| kind.slot(&s.operations));
    if let Some(Ok(req)) = ops::pending(sj, kind) {
        let state = match recorded.filter(|o| o.id == req.id) {
            Some(o) => format!("accepted, {}", o.message),
            None => "not yet seen by a controller".into(),
        };
        return Err(busy(req.id, state));
    }
    if let Some(o) = recorded.filter(|o| o.phase == OperationPhase::Running) {
        return Err(busy(o.id.clone(), format!("in progress, {}", o.message)));
    }
    Ok(())
}

/// The merge patch that writes `req` into `kind`'s annotation, guarded by the resourceVersion
/// `sj` was checked at: a request written since makes it fail with a conflict.
fn request_patch(
    sj: &SingletonJob,
    kind: OperationKind,
    req: &Request,
) -> Result<serde_json::Value, PluginError> {
    let value = serde_json::to_string(req).map_err(|e| PluginError::Encode(e.to_string()))?;
    Ok(serde_json::json!({"metadata": {
        "resourceVersion": sj.resource_version(),
        "annotations": {kind.annotation(): value},
    }}))
}

/// The controller's record of request `id`, once it has made one.
fn record_of(sj: &SingletonJob, kind: OperationKind, id: &str) -> Option<OperationStatus> {
    sj.status
        .as_ref()
        .and_then(|s| kind.slot(&s.operations))
        .filter(|o| o.id == id)
        .cloned()
}

/// Whether the record ends the wait: done, or for a backfill under way, accepted (enough unless
/// asked to wait for the whole range). A rejection is the command's error.
fn finished(op: &OperationStatus, kind: OperationKind, wait: Wait) -> Result<bool, PluginError> {
    match op.phase {
        OperationPhase::Done => Ok(true),
        OperationPhase::Rejected => Err(PluginError::Rejected {
            command: kind.command(),
            message: crate::text::printable(&op.message),
        }),
        OperationPhase::Running => Ok(!wait.until_done),
        OperationPhase::Pending => Ok(false),
    }
}

/// Nobody recorded the request in time: what to check, and how to withdraw the request.
fn no_controller(kind: OperationKind, ns: &str, name: &str, timeout: Duration) -> PluginError {
    PluginError::NoController(format!(
        "no controller acted on the {cmd} request within {secs}s: is singleton-controller running, and does it watch namespace {ns}? The request stays in annotation {key} and is carried out when a controller sees it; withdraw it with: kubectl annotate singletonjob {name} -n {ns} {key}-",
        cmd = kind.command(),
        secs = timeout.as_secs(),
        key = kind.annotation(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::fixtures::{now, sj};
    use crate::plugin::render::{Output, format_operation, render_status};

    #[test]
    fn operations_are_shown_and_a_pending_one_is_not_overwritten() {
        use crate::api::{ANNOTATION_TRIGGER, Operations};
        let mut s = sj();
        let req = new_request(Some("alice".into()), now());
        assert!(req.id.contains('.'), "microseconds in {}", req.id);
        let mut done = ops::accepted(&req, now());
        done.phase = OperationPhase::Done;
        done.message = "started Job hello-1-000001 with fencing token 21".into();
        *s.status.as_mut().unwrap().operations = Operations {
            trigger: Some(done.clone()),
            ..Default::default()
        };
        let out = render_status(&s, now());
        let ops_part = out.split("Operations:").nth(1).expect(&out);
        for want in ["trigger", "Done", "alice", "fencing token 21"] {
            assert!(ops_part.contains(want), "{want:?} in\n{out}");
        }
        let line =
            format_operation(OperationKind::Trigger, "ns", "hello", &done, Output::Table).unwrap();
        assert!(
            line.starts_with("singletonjob ns/hello triggered: started Job"),
            "{line}"
        );
        let json =
            format_operation(OperationKind::Trigger, "ns", "hello", &done, Output::Json).unwrap();
        assert_eq!(
            serde_json::from_str::<OperationStatus>(&json).unwrap(),
            done
        );

        // A rerun's line names the period, the Job and the token.
        let mut rerun = ops::accepted(&req, now());
        rerun.phase = OperationPhase::Done;
        rerun.message = "re-ran period 2026-01-01T09:00:00Z: started Job hello-1767258000-r22 with fencing token 22".into();
        let line =
            format_operation(OperationKind::Rerun, "ns", "hello", &rerun, Output::Table).unwrap();
        assert!(
            line.starts_with("singletonjob ns/hello: re-ran period 2026-01-01T09:00:00Z: started Job hello-1767258000-r22 with fencing token 22 (request "),
            "{line}"
        );

        // A repair's dry run lists its periods, one per line, and says how many it left out.
        let mut dry = ops::accepted(&req, now());
        dry.phase = OperationPhase::Done;
        dry.message = "would re-run 3 of 30 period(s) (3 failed)".into();
        dry.periods = vec![
            "2026-09-17T22:00:00Z".parse::<Timestamp>().unwrap().into(),
            "2026-09-03T22:00:00Z".parse::<Timestamp>().unwrap().into(),
        ];
        dry.selected = Some(3);
        let out = format_operation(
            OperationKind::RepairDryRun,
            "ns",
            "hello",
            &dry,
            Output::Table,
        )
        .unwrap();
        assert_eq!(
            out.lines().skip(1).collect::<Vec<_>>(),
            [
                "  2026-09-17T22:00:00Z",
                "  2026-09-03T22:00:00Z",
                "  ... and 1 more (narrow --from/--to to list them)"
            ],
            "{out}"
        );
        assert!(
            out.starts_with("singletonjob ns/hello: dry run: would re-run 3"),
            "{out}"
        );

        // The handled request in the annotation: a new one may be written.
        let raw = serde_json::to_string(&req).unwrap();
        s.metadata.annotations = Some([(ANNOTATION_TRIGGER.to_string(), raw)].into());
        assert!(check_not_busy(&s, OperationKind::Trigger).is_ok());
        // Accepted but waiting, or never seen: refused, saying how to withdraw it.
        let mut waiting = done.clone();
        waiting.phase = OperationPhase::Pending;
        waiting.message = "waiting for the active run x to finish".into();
        s.status.as_mut().unwrap().operations.trigger = Some(waiting);
        let e = check_not_busy(&s, OperationKind::Trigger)
            .unwrap_err()
            .to_string();
        assert!(e.contains("accepted, waiting for the active run"), "{e}");
        assert!(e.contains("singleton.dev/trigger-"), "{e}");
        s.status.as_mut().unwrap().operations.trigger = None;
        let e = check_not_busy(&s, OperationKind::Trigger)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not yet seen by a controller"), "{e}");
    }
}
