//! Asking for an operation (trigger, backfill, break-lock): the plugin only asks. It writes the
//! request into the SingletonJob's annotation and waits for the controller to record what it did
//! in `status.operations` (the controller's side is [`crate::decide::ops`]).

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::client::Cluster;
use super::error::PluginError;
use crate::api::{OperationPhase, OperationStatus, SingletonJob};
use crate::decide::ops::{self, OperationKind, Request};

/// How long an operation command waits, and for what.
#[derive(Clone, Copy, Debug)]
pub struct Wait {
    /// Give up after this long.
    pub timeout: std::time::Duration,
    /// Backfill: wait until the whole range is done, not only until it is accepted.
    pub until_done: bool,
}

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
        let api: Api<SingletonJob> = Api::namespaced(self.client.clone(), ns);
        // A few tries: the controller writes the status all the time, which changes the
        // resourceVersion the patch is guarded by.
        let mut tries = 0;
        loop {
            tries += 1;
            let sj = self.get(ns, name).await?;
            check_not_busy(&sj, kind)?;
            if kind == OperationKind::Backfill && sj.spec.backstop.is_none() {
                return Err(PluginError::Rejected {
                    command: kind.command(),
                    message: "backfill needs spec.backstop: only the backstop's claims table remembers every period that ever ran".into(),
                });
            }
            let value =
                serde_json::to_string(&req).map_err(|e| PluginError::Encode(e.to_string()))?;
            let patch = serde_json::json!({"metadata": {
                "resourceVersion": sj.resource_version(),
                "annotations": {kind.annotation(): value},
            }});
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => break,
                Err(kube::Error::Api(s)) if s.code == 409 && tries < 5 => continue,
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    return Err(PluginError::NotFound {
                        namespace: ns.into(),
                        name: name.into(),
                    });
                }
                Err(e) => return Err(self.api_error(e, "patch", Some(ns))),
            }
        }

        let deadline = tokio::time::Instant::now() + wait.timeout;
        let mut seen: Option<OperationStatus> = None;
        loop {
            let sj = self.get(ns, name).await?;
            let op = sj
                .status
                .as_ref()
                .and_then(|s| kind.slot(&s.operations))
                .filter(|o| o.id == req.id)
                .cloned();
            if let Some(op) = &op {
                let finished = match op.phase {
                    OperationPhase::Done => true,
                    OperationPhase::Rejected => {
                        return Err(PluginError::Rejected {
                            command: kind.command(),
                            message: op.message.clone(),
                        });
                    }
                    // A backfill under way has been accepted: enough unless asked to wait.
                    OperationPhase::Running => !wait.until_done,
                    OperationPhase::Pending => false,
                };
                if finished {
                    return Ok(op.clone());
                }
            }
            seen = op.or(seen);
            if tokio::time::Instant::now() >= deadline {
                return match seen {
                    // Accepted and waiting (for a run to finish, the clock, the backstop): the
                    // controller carries it out; say what it waits for.
                    Some(op) => Ok(op),
                    None => Err(PluginError::NoController(format!(
                        "no controller acted on the {cmd} request within {secs}s: is singleton-controller running, and does it watch namespace {ns}? The request stays in annotation {key} and is carried out when a controller sees it; withdraw it with: kubectl annotate singletonjob {name} -n {ns} {key}-",
                        cmd = kind.command(),
                        secs = wait.timeout.as_secs(),
                        key = kind.annotation(),
                    ))),
                };
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }
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

/// A new request: its id is the time of asking, with microseconds.
pub fn new_request(by: Option<String>, now: Timestamp) -> Request {
    Request {
        id: crate::naming::period_rfc3339(crate::naming::manual_period(now)),
        by,
        ..Request::default()
    }
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
