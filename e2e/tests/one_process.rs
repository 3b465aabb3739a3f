//! A run is one process at a time, and only the controller starts one (issue 31): the findings of
//! the run-protocol review that the fake node can show, each test named after what it proves and
//! each failing on the code before its fix. The real node's (pods deleted, drained, partitioned)
//! are in tests/real_node.rs and the chaos suite; the database's own in the backstop's tests.

use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::{
    Env, FAST_ELECTION, Observer, backstop_secret, backstop_spec, database_url, ensure,
    events_with_reason, kubectl, never_scheduled, once_at, pg, proxied_backstop_secret, run_ok,
    sj_yaml, table_prefix,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use singleton::api::{Outcome, SingletonJob};

/// The history entries of `name` with `reason`.
fn with_reason(sj: &SingletonJob, reason: &str) -> usize {
    sj.status.as_ref().map_or(0, |s| {
        s.history
            .iter()
            .filter(|h| h.reason.as_deref() == Some(reason))
            .count()
    })
}

/// Unsuspends every Job of the namespace labelled `singleton.dev/job` (optionally only those
/// carrying `label`), every 50 ms, as a person, a GitOps tool or a queue would: until dropped.
struct Resumer(tokio::task::JoinHandle<()>);

impl Resumer {
    fn start(env: &Env, label: Option<&'static str>) -> Resumer {
        let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.ns);
        Resumer(tokio::spawn(async move {
            let selector = match label {
                Some(l) => format!("singleton.dev/job,{l}"),
                None => "singleton.dev/job".to_string(),
            };
            loop {
                if let Ok(list) = jobs.list(&ListParams::default().labels(&selector)).await {
                    for job in list {
                        if job.spec.as_ref().and_then(|s| s.suspend) != Some(true) {
                            continue;
                        }
                        let name = job.metadata.name.clone().unwrap_or_default();
                        let patch = serde_json::json!({"spec": {"suspend": false}});
                        let _ = jobs
                            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }))
    }
}

impl Drop for Resumer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// F2: a person or a tool unsuspending the controller's Jobs (no queue, no backstop) starts runs
/// before their claims are confirmed. Each Job someone else started is stopped (deleted by uid)
/// and its period decided Failed/StartedBeforeConfirm with an Event; no period has two Jobs that
/// ran, and once the resumer stops, periods run normally again.
#[tokio::test]
async fn a_job_started_by_someone_else_is_stopped_and_its_period_decided() -> Result<()> {
    let mut env = Env::new("rogue").await?;
    let watch = Observer::watch(env.client.clone(), &env.ns).await?;
    env.start_controller(&[]).await?;
    let resumer = Resumer::start(&env, None);
    env.create_sj(&sj_yaml("rogue", "*/2 * * * * *", ""))
        .await?;
    env.wait_for(
        "two Jobs started by the resumer, stopped and decided",
        Duration::from_secs(60),
        || async {
            let sj = env.get_sj("rogue").await?;
            Ok((with_reason(&sj, "StartedBeforeConfirm") >= 2).then_some(()))
        },
    )
    .await?;
    drop(resumer);
    let stopped: Vec<_> = watch
        .jobs()
        .into_iter()
        .filter(|j| j.ran_unreleased)
        .collect();
    // Every Job that ran without the controller's release is gone again.
    env.wait_for(
        "the Jobs someone else started to be deleted",
        Duration::from_secs(30),
        || async {
            let left: Vec<String> = env
                .job_list()
                .await?
                .iter()
                .filter(|j| {
                    stopped
                        .iter()
                        .any(|s| Some(&s.uid) == j.metadata.uid.as_ref())
                })
                .filter(|j| j.metadata.deletion_timestamp.is_none())
                .filter_map(|j| j.metadata.name.clone())
                .collect();
            Ok(left.is_empty().then_some(()))
        },
    )
    .await?;
    // Without the resumer the schedule runs again, each run released by the controller.
    let after = Timestamp::now();
    env.wait_for(
        "a run released by the controller",
        Duration::from_secs(30),
        || async {
            let ok = watch.jobs().iter().any(|j| {
                j.ran && !j.ran_unreleased && j.period.is_some_and(|p| p > after) && j.finished
            });
            Ok(ok.then_some(()))
        },
    )
    .await?;
    let events = events_with_reason(&env, "StartedBeforeConfirm").await?;
    let seconds = watch.second_runs();
    ensure(
        &env,
        !stopped.is_empty() && !events.is_empty() && seconds.is_empty(),
        (
            "Jobs started outside the controller are stopped, with an Event; never two per period",
            ("stopped", stopped.len()),
            ("events", events.len()),
            &seconds,
        ),
    )
    .await
}

/// F2: a mutating admission policy that clears `spec.suspend` at create hands the controller a
/// Job that may start before any confirm. The controller deletes it at once and decides the period
/// Failed/JobNotSuspended with an Event; it is never confirmed or resumed.
#[tokio::test]
async fn a_job_the_api_server_returns_running_is_deleted_and_its_period_decided() -> Result<()> {
    let mut env = Env::new("mutated").await?;
    let watch = Observer::watch(env.client.clone(), &env.ns).await?;
    let _policy = unsuspend_at_create(&env)?;
    policy_in_effect(&env).await?;
    env.start_controller(&[]).await?;
    // One period, a few seconds ahead: its run is prepared at once (issue 33), so its create
    // meets the policy before the instant.
    let at = Timestamp::now() + SignedDuration::from_secs(6);
    env.create_sj(&sj_yaml("mutated", &once_at(at), "")).await?;
    let sj = env
        .wait_for(
            "the period decided JobNotSuspended",
            Duration::from_secs(60),
            || async {
                let sj = env.get_sj("mutated").await?;
                Ok((with_reason(&sj, "JobNotSuspended") >= 1).then_some(sj))
            },
        )
        .await?;
    let entry = sj
        .status
        .as_ref()
        .and_then(|s| {
            s.history
                .iter()
                .find(|h| h.reason.as_deref() == Some("JobNotSuspended"))
                .cloned()
        })
        .context("the entry")?;
    env.wait_for(
        "the Job returned running to be gone",
        Duration::from_secs(30),
        || async { Ok(env.job_list().await?.is_empty().then_some(())) },
    )
    .await?;
    let events = events_with_reason(&env, "JobNotSuspended").await?;
    let st = sj.status.clone().unwrap_or_default();
    ensure(
        &env,
        entry.outcome == Outcome::Failed
            && !events.is_empty()
            && st.active.is_empty()
            && st.pending_claim.is_none()
            && watch.jobs().len() == 1,
        (
            "decided Failed with an Event, never confirmed",
            &entry,
            events.len(),
            watch.jobs(),
        ),
    )
    .await
}

/// Waits until the API server applies the policy (it loads policies in the background): a
/// dry-run create of a suspended Job comes back unsuspended.
async fn policy_in_effect(env: &Env) -> Result<()> {
    let job: Job = serde_json::from_value(serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "policy-probe"},
        "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "x", "image": "busybox"}]}}}
    }))?;
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    env.wait_for(
        "the admission policy in effect",
        Duration::from_secs(30),
        || async {
            let j = env.jobs().create(&pp, &job).await?;
            let unsuspended = j.spec.and_then(|s| s.suspend) == Some(false);
            Ok(unsuspended.then_some(()))
        },
    )
    .await
}

/// A cluster-scoped admission policy and its binding to the test's namespace only, applied from
/// YAML (`{name}` and `{ns}` filled in); both deleted when dropped.
struct Policy {
    kind: &'static str,
    name: String,
}

impl Policy {
    fn apply(env: &Env, kind: &'static str, tag: &str, yaml: &str) -> Result<Policy> {
        let name = format!("e2e-{tag}-{}", env.ns);
        let binding = format!(
            "---\napiVersion: admissionregistration.k8s.io/v1\nkind: {kind}Binding\nmetadata: {{name: {name}, labels: {{singleton.dev/e2e: \"true\"}}}}\nspec:\n  policyName: {name}\n{extra}  matchResources:\n    namespaceSelector:\n      matchLabels: {{kubernetes.io/metadata.name: {ns}}}\n",
            extra = if kind == "ValidatingAdmissionPolicy" {
                "  validationActions: [Deny]\n"
            } else {
                ""
            },
            ns = env.ns
        );
        let head = format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: {kind}\nmetadata: {{name: {name}, labels: {{singleton.dev/e2e: \"true\"}}}}\n"
        );
        let file = env.log_dir().join(format!("{tag}-policy.yaml"));
        std::fs::write(&file, format!("{head}{yaml}{binding}"))?;
        run_ok(kubectl().args(["apply", "-f"]).arg(&file))?;
        Ok(Policy { kind, name })
    }
}

impl Drop for Policy {
    fn drop(&mut self) {
        let (kind, name) = (self.kind.to_lowercase(), &self.name);
        let _ = kubectl()
            .args(["delete", "--ignore-not-found", "--wait=false"])
            .arg(format!("{kind}binding/{name}"))
            .arg(format!("{kind}/{name}"))
            .output();
    }
}

/// A MutatingAdmissionPolicy that sets `spec.suspend: false` on every Job created.
fn unsuspend_at_create(env: &Env) -> Result<Policy> {
    let spec = r#"spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [batch], apiVersions: [v1], operations: [CREATE], resources: [jobs]}
  failurePolicy: Fail
  reinvocationPolicy: Never
  mutations:
  - patchType: JSONPatch
    jsonPatch:
      expression: '[JSONPatch{op: "add", path: "/spec/suspend", value: false}]'
"#;
    Policy::apply(env, "MutatingAdmissionPolicy", "unsuspend", spec)
}

/// F2, the queue's contract: a queue-managed template (`spec.suspend: true`, a Kueue queue label)
/// gets its Jobs created without the label; the controller adds it with the release after the
/// confirm. A queue that admits only labelled Jobs (Kueue's default) so admits only confirmed
/// runs: every period runs once, released, and none is stopped.
#[tokio::test]
async fn a_queue_admits_only_runs_whose_claim_is_confirmed() -> Result<()> {
    let mut env = Env::new("queue").await?;
    let watch = Observer::watch(env.client.clone(), &env.ns).await?;
    env.start_controller(&[]).await?;
    let _queue = Resumer::start(&env, Some("kueue.x-k8s.io/queue-name=billing"));
    let yaml = sj_yaml("queued", "*/2 * * * * *", "").replace(
        "    spec:\n      backoffLimit: 0\n",
        "    metadata:\n      labels: {kueue.x-k8s.io/queue-name: billing}\n    spec:\n      suspend: true\n      backoffLimit: 0\n",
    );
    env.create_sj(&yaml).await?;
    env.wait_for(
        "three queued runs succeeded",
        Duration::from_secs(60),
        || async {
            let sj = env.get_sj("queued").await?;
            let ok = sj.status.as_ref().map_or(0, |s| {
                s.history
                    .iter()
                    .filter(|h| h.outcome == Outcome::Succeeded)
                    .count()
            });
            Ok((ok >= 3).then_some(()))
        },
    )
    .await?;
    let sj = env.get_sj("queued").await?;
    let jobs = env.job_list().await?;
    let labelled = jobs.iter().all(|j| {
        let released = j
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("singleton.dev/released"))
            .is_some_and(|v| v != "false");
        let queued = j
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kueue.x-k8s.io/queue-name"))
            .is_some();
        released == queued
    });
    let unreleased = watch.jobs().iter().filter(|j| j.ran_unreleased).count();
    ensure(
        &env,
        labelled && unreleased == 0 && with_reason(&sj, "StartedBeforeConfirm") == 0,
        (
            "the queue label comes with the release; no run started before its confirm",
            labelled,
            unreleased,
            watch.jobs(),
        ),
    )
    .await
}

/// F3: with a backstop under Correctness, a run's outcome is recorded only once its token's
/// retirement is written. The controller's link to the database is cut when the run ends (its Job
/// deleted, say by a person): nothing is recorded while it is cut; once it is back the outcome is
/// recorded and the run's token is refused by the fence (retired), so no copy of the run can
/// write after its period was decided.
#[tokio::test]
async fn a_runs_outcome_waits_for_the_retirement_of_its_token() -> Result<()> {
    let mut env = Env::new("retire").await?;
    let prefix = table_prefix(&env);
    let proxy = proxied_backstop_secret(&env, "db").await?;
    env.start_controller(&[]).await?;
    let at = Timestamp::now() + SignedDuration::from_secs(4);
    let spec = backstop_spec("db", &prefix, "  failedJobsHistoryLimit: 5\n");
    env.create_sj(&never_scheduled(sj_yaml("ret", &once_at(at), &spec)))
        .await?;
    let run = env
        .wait_for("the run to be active", Duration::from_secs(40), || async {
            let sj = env.get_sj("ret").await?;
            Ok(sj.status.and_then(|s| s.active.first().cloned()))
        })
        .await?;
    proxy.down();
    env.jobs()
        .delete(&run.job_name, &Default::default())
        .await?;
    env.wait_job_gone("the run's Job", &run.job_name).await?;
    // While the database is cut off, the ended run stays active: nothing is recorded.
    let cut = tokio::time::Instant::now();
    while cut.elapsed() < Duration::from_secs(6) {
        let st = env.get_sj("ret").await?.status.unwrap_or_default();
        let recorded = st
            .history
            .iter()
            .any(|h| h.job_name.as_ref() == Some(&run.job_name) && h.outcome == Outcome::Failed);
        ensure(
            &env,
            !recorded,
            (
                "an outcome recorded before its token could be retired",
                &st.history,
            ),
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    proxy.up();
    env.wait_for(
        "the outcome, once retired",
        Duration::from_secs(60),
        || async {
            let st = env.get_sj("ret").await?.status.unwrap_or_default();
            Ok(st
                .history
                .iter()
                .any(|h| h.job_name.as_ref() == Some(&run.job_name) && h.outcome == Outcome::Failed)
                .then_some(()))
        },
    )
    .await?;
    let fenced = pg()
        .await?
        .query_one(
            &format!("SELECT {prefix}fence($1, $2)"),
            &[&format!("{}/ret", env.ns), &(run.token as i64)],
        )
        .await;
    let refused = matches!(&fenced, Err(e) if e.code().map(|c| c.code()) == Some("SF001"));
    ensure(
        &env,
        refused,
        (
            "the decided run's token still accepted",
            fenced.map(|r| r.get::<_, i64>(0)),
        ),
    )
    .await
}

/// F5: a queue-managed run is confirmed and released, and waits in its queue (suspended) when its
/// SingletonJob's status is wiped (or restored from an old copy). The wiped status adopts it as
/// the period's run instead of the sweep deleting it as a Job no claim knows: the period keeps its
/// run.
#[tokio::test]
async fn a_wiped_status_adopts_a_confirmed_run_waiting_in_its_queue() -> Result<()> {
    let mut env = Env::new("wipe").await?;
    env.start_controller(&[]).await?;
    let at = Timestamp::now() + SignedDuration::from_secs(4);
    let yaml = sj_yaml("waiting", &once_at(at), "").replace(
        "    spec:\n      backoffLimit: 0\n",
        "    spec:\n      suspend: true\n      backoffLimit: 0\n",
    );
    env.create_sj(&yaml).await?;
    let run = env
        .wait_for(
            "the run confirmed and released",
            Duration::from_secs(40),
            || async {
                let sj = env.get_sj("waiting").await?;
                let Some(run) = sj.status.and_then(|s| s.active.first().cloned()) else {
                    return Ok(None);
                };
                let job = env.jobs().get(&run.job_name).await?;
                let released = job
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("singleton.dev/released"))
                    .is_some_and(|v| v != "false");
                Ok(released.then_some(run))
            },
        )
        .await?;
    // Wipe the status (the subresource replaced with an empty one); again when the controller
    // wrote it between the read and the replace (a 409).
    env.wait_for("the status wiped", Duration::from_secs(10), || async {
        let mut sj = env.get_sj("waiting").await?;
        sj.status = Some(Default::default());
        let pp = PostParams::default();
        match env.sjs().replace_status("waiting", &pp, &sj).await {
            Ok(_) => Ok(Some(())),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
            Err(e) => Err(e.into()),
        }
    })
    .await?;
    env.wait_for("the run adopted again", Duration::from_secs(30), || async {
        let st = env.get_sj("waiting").await?.status.unwrap_or_default();
        Ok(st
            .active
            .iter()
            .any(|r| r.job_uid == run.job_uid)
            .then_some(()))
    })
    .await?;
    // Later reconciles (the sweep among them) must leave it alone: watched for 3 s.
    let kept = || async {
        let job = env.jobs().get_opt(&run.job_name).await?;
        let removed = events_with_reason(&env, "UnknownJobRemoved").await?;
        Ok(job.is_some_and(|j| j.metadata.deletion_timestamp.is_none()) && removed.is_empty())
    };
    env.holds_for("the queued run's Job kept", Duration::from_secs(3), kept)
        .await
}

/// F11: someone who may create Jobs in the namespace pre-creates a suspended Job with the next
/// period's name and token (both predictable). The controller does not adopt, confirm or resume
/// it: it is not this SingletonJob's Job for the period, and the period is decided
/// Failed/JobNameTaken.
#[tokio::test]
async fn a_precreated_job_with_the_periods_name_and_token_is_never_run() -> Result<()> {
    let mut env = Env::new("squat").await?;
    let at = Timestamp::now() + SignedDuration::from_secs(6);
    let name = format!("squat-{}", at.as_second());
    let job: Job = serde_json::from_value(serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"singleton.dev/job": "squat"},
            "annotations": {"singleton.dev/fencing-token": "1"}},
        "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "x", "image": "busybox"}]}}}
    }))?;
    env.jobs().create(&PostParams::default(), &job).await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("squat", &once_at(at), "")).await?;
    let sj = env
        .wait_for("the period decided", Duration::from_secs(40), || async {
            let sj = env.get_sj("squat").await?;
            Ok((with_reason(&sj, "JobNameTaken") >= 1).then_some(sj))
        })
        .await?;
    let planted = env.jobs().get(&name).await?;
    ensure(
        &env,
        planted.spec.as_ref().and_then(|s| s.suspend) == Some(true)
            && sj.status.as_ref().is_some_and(|s| s.active.is_empty()),
        (
            "the planted Job never resumed nor adopted",
            &planted.spec,
            &sj.status,
        ),
    )
    .await
}

/// F10a: an admission policy refuses the unsuspend of the controller's Jobs, with a message that
/// happens to contain "test". The refused resume is not taken for a failed JSON-patch test (it was
/// read as "resumed already" and the run silently never started), and past the period's wait
/// bound the run is stopped and decided Missed/ResumeRefused with an Event, so later periods are
/// not blocked behind it.
#[tokio::test]
async fn a_refused_resume_is_decided_at_its_bound_not_retried_for_ever() -> Result<()> {
    let mut env = Env::new("refused").await?;
    let _policy = deny_resume(&env)?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml(
        "refused",
        "*/3 * * * * *",
        "  startingDeadlineSeconds: 2\n",
    ))
    .await?;
    let sj = env
        .wait_for(
            "two periods decided ResumeRefused",
            Duration::from_secs(60),
            || async {
                let sj = env.get_sj("refused").await?;
                Ok((with_reason(&sj, "ResumeRefused") >= 2).then_some(sj))
            },
        )
        .await?;
    let events = events_with_reason(&env, "ResumeRefused").await?;
    let entry = sj
        .status
        .as_ref()
        .and_then(|s| {
            s.history
                .iter()
                .find(|h| h.reason.as_deref() == Some("ResumeRefused"))
                .cloned()
        })
        .context("the entry")?;
    ensure(
        &env,
        entry.outcome == Outcome::Missed && !events.is_empty(),
        ("decided Missed with an Event", &entry, events.len()),
    )
    .await
}

/// A ValidatingAdmissionPolicy that denies clearing `spec.suspend` on Jobs, with a message that
/// mentions a test.
fn deny_resume(env: &Env) -> Result<Policy> {
    let spec = r#"spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {apiGroups: [batch], apiVersions: [v1], operations: [UPDATE], resources: [jobs]}
  validations:
  - expression: "!(oldObject.spec.suspend == true && object.spec.suspend == false)"
    message: "resuming Jobs is frozen during the load test window"
"#;
    Policy::apply(env, "ValidatingAdmissionPolicy", "deny-resume", spec)
}

/// F6: a workload on a node that died mid-transaction keeps its database session, and so the
/// fence row's lock, for hours. Later periods are not blocked for ever: each waits at most until
/// the next period and is then recorded Missed/FenceHeld; and `break-lock` ends the session
/// holding the fence (its transaction rolls back) and completes, after which periods run again.
#[tokio::test]
async fn a_fence_held_by_a_lost_session_blocks_neither_later_periods_nor_break_lock() -> Result<()>
{
    let mut env = Env::new("held").await?;
    let prefix = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    env.start_controller(&[]).await?;
    // Allow: the next period is claimed although the first run is still active (its pod never
    // gets a node: it stands for the workload on the dead node).
    let spec = backstop_spec(
        "db",
        &prefix,
        "  concurrencyPolicy: Allow
",
    );
    env.create_sj(&never_scheduled(sj_yaml("held", "*/4 * * * * *", &spec)))
        .await?;
    let first = env
        .wait_for("a first run", Duration::from_secs(40), || async {
            let st = env.get_sj("held").await?.status.unwrap_or_default();
            Ok(st.active.first().map(|r| r.token))
        })
        .await?;
    // Its workload opens its transaction, fences, and is then cut off with it open.
    let job = format!("{}/held", env.ns);
    let mut lost = pg().await?;
    let tx = lost.transaction().await?;
    let fenced = tx
        .query_one(
            &format!("SELECT {prefix}fence($1, $2)"),
            &[&job, &(first as i64)],
        )
        .await;
    if fenced.is_err() {
        // The next period's claim advanced the fence first: the test's timing, not the product.
        anyhow::bail!(
            "the first run's token was no longer current when the workload fenced: {fenced:?}"
        );
    }
    env.wait_for(
        "a period recorded Missed/FenceHeld, not waited for for ever",
        Duration::from_secs(60),
        || async {
            let sj = env.get_sj("held").await?;
            Ok((with_reason(&sj, "FenceHeld") >= 1).then_some(()))
        },
    )
    .await?;
    let out = e2e::plugin(
        &[
            "break-lock",
            "held",
            "-n",
            &env.ns,
            "--reason",
            "a node died mid-run",
        ],
        &[],
    )?;
    ensure(
        &env,
        out.status.success(),
        ("break-lock", e2e::stderr(&out)),
    )
    .await?;
    env.wait_for(
        "break-lock to complete",
        Duration::from_secs(60),
        || async {
            let st = env.get_sj("held").await?.status.unwrap_or_default();
            let done = st
                .operations
                .break_lock
                .as_ref()
                .is_some_and(|o| o.phase == singleton::api::OperationPhase::Done);
            Ok(done.then_some(()))
        },
    )
    .await?;
    let ended = tx.commit().await.is_err();
    let after = Timestamp::now();
    env.wait_for(
        "a period claimed after break-lock",
        Duration::from_secs(40),
        || async {
            let st = env.get_sj("held").await?.status.unwrap_or_default();
            Ok(st
                .active
                .iter()
                .any(|r| r.period.0 > after && r.token > first)
                .then_some(()))
        },
    )
    .await?;
    ensure(&env, ended, "the session holding the fence was ended").await
}

/// F4: a replica paused inside its create (past the gate check, the window a check cannot close)
/// while another replica completes its claim and starts the run. Resumed, its create is refused
/// by a quota and it is past the starting deadline: it must not decide the period "without a
/// Job" and retire the token the live run is using.
#[tokio::test]
async fn a_stale_replica_cannot_retire_the_token_of_a_run_another_replica_started() -> Result<()> {
    let mut env = Env::new("stale-retire").await?;
    let prefix = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    let quota = serde_json::json!({"apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "one-job"}, "spec": {"hard": {"count/jobs.batch": "1"}}});
    Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &serde_json::from_value(quota)?)
        .await?;
    let lease = ["--lease-name", "singleton-controller"];
    let elect = [FAST_ELECTION, &lease].concat();
    let armed = [(
        "SINGLETON_FAILPOINTS".to_string(),
        format!("{}=stop", singleton::failpoint::CREATE_LANE),
    )];
    env.start_controller_with_env(&armed, &elect).await?;
    env.wait_for("replica 0 to lead", Duration::from_secs(30), || async {
        Ok(lease_holder(&env)
            .await?
            .is_some_and(|h| h.starts_with("e2e-0-"))
            .then_some(()))
    })
    .await?;
    env.start_controller(&elect).await?;
    let at = Timestamp::now() + SignedDuration::from_secs(4);
    let extra = backstop_spec("db", &prefix, "  startingDeadlineSeconds: 5\n");
    env.create_sj(&never_scheduled(sj_yaml("stale", &once_at(at), &extra)))
        .await?;
    env.wait_for(
        "replica 0 to freeze in its create",
        Duration::from_secs(30),
        || async { Ok(env.controller_stopped(0).then_some(())) },
    )
    .await?;
    let run = env
        .wait_for(
            "replica 1 to start the run",
            Duration::from_secs(60),
            || async {
                let sj = env.get_sj("stale").await?;
                Ok(sj.status.and_then(|s| s.active.first().cloned()))
            },
        )
        .await?;
    // Past the starting deadline, the frozen replica resumes: its create is refused (the quota
    // is full with the live run's Job) and it exits once it notices its lost Lease.
    let deadline = at + SignedDuration::from_secs(5);
    env.wait_for(
        "the period's starting deadline",
        Duration::from_secs(30),
        || async { Ok((Timestamp::now() > deadline).then_some(())) },
    )
    .await?;
    env.signal_controller(0, "CONT").await?;
    env.wait_for("replica 0 to exit", Duration::from_secs(30), || async {
        Ok(env.controller_exited(0).then_some(()))
    })
    .await?;
    let fenced = pg()
        .await?
        .query_one(
            &format!("SELECT {prefix}fence($1, $2)"),
            &[&format!("{}/stale", env.ns), &(run.token as i64)],
        )
        .await;
    let st = env.get_sj("stale").await?.status.unwrap_or_default();
    ensure(
        &env,
        fenced.is_ok() && st.active.iter().any(|r| r.token == run.token),
        (
            "the live run's token retired by a stale replica",
            fenced.map(|r| r.get::<_, i64>(0)),
            &st.active,
            env.controller_log(0),
        ),
    )
    .await
}

async fn lease_holder(env: &Env) -> Result<Option<String>> {
    let api: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(env.client.clone(), &env.ns);
    Ok(api
        .get_opt("singleton-controller")
        .await?
        .and_then(|l| l.spec?.holder_identity))
}

/// F13: under Replace without a backstop nothing fences the replaced run, so the new run must not
/// start while the old run's pods still run. The old run's pod is held terminating (a finalizer,
/// standing for a grace period or a node that stopped answering): no Job of the new run is
/// created until the old Job, deleted in the foreground, is gone; a period that cannot wait longer
/// is recorded Missed/ReplacedRunStillRunning; once the old pod goes, the new run starts.
#[tokio::test]
async fn a_replaced_run_without_a_backstop_is_gone_before_the_new_one_starts() -> Result<()> {
    let mut env = Env::new("replace-gone").await?;
    let watch = Observer::watch(env.client.clone(), &env.ns).await?;
    env.start_controller(&[]).await?;
    let spec = "  concurrencyPolicy: Replace\n";
    env.create_sj(&never_scheduled(sj_yaml("repl", "*/5 * * * * *", spec)))
        .await?;
    let first = env
        .wait_for("a first run", Duration::from_secs(40), || async {
            let st = env.get_sj("repl").await?.status.unwrap_or_default();
            Ok(st.active.first().cloned())
        })
        .await?;
    // Its pod stays terminating until the test lets it go.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let pod = env
        .wait_for("the first run's pod", Duration::from_secs(30), || async {
            let list = pods
                .list(&ListParams::default().labels(&format!("job-name={}", first.job_name)))
                .await?;
            Ok(list.items.into_iter().next())
        })
        .await?;
    let pod_name = pod.metadata.name.clone().context("pod name")?;
    let hold = serde_json::json!({"metadata": {"finalizers": ["singleton.dev/e2e-hold"]}});
    pods.patch(&pod_name, &PatchParams::default(), &Patch::Merge(&hold))
        .await?;
    // The next period replaces it: the old Job is deleted, and stays (foreground) while its pod
    // is held.
    env.wait_for(
        "the replace to delete the first run",
        Duration::from_secs(30),
        || async {
            let job = env.jobs().get_opt(&first.job_name).await?;
            Ok(job
                .is_some_and(|j| j.metadata.deletion_timestamp.is_some())
                .then_some(()))
        },
    )
    .await?;
    env.wait_for(
        "a period that could not wait to be recorded",
        Duration::from_secs(30),
        || async {
            let sj = env.get_sj("repl").await?;
            Ok((with_reason(&sj, "ReplacedRunStillRunning") >= 1).then_some(()))
        },
    )
    .await?;
    let early: Vec<_> = watch
        .jobs()
        .into_iter()
        .filter(|j| j.uid != first.job_uid.clone().unwrap_or_default())
        .collect();
    ensure(
        &env,
        early.is_empty(),
        (
            "a new run's Job created while the replaced run's pod still ran",
            &early,
        ),
    )
    .await?;
    // The old pod goes; the next period starts its run.
    let release = serde_json::json!({"metadata": {"finalizers": null}});
    // The old Job cannot be gone before its pod is released. Judged against this instant, not
    // against when the poll below saw it gone: that lags the deletion, and a Job created right
    // after it (its creationTimestamp cut to the second) failed a CI run by 1.6 ms.
    let released_at = Timestamp::now();
    pods.patch(&pod_name, &PatchParams::default(), &Patch::Merge(&release))
        .await?;
    env.wait_job_gone("the replaced run's Job", &first.job_name)
        .await?;
    env.wait_for("the new run", Duration::from_secs(30), || async {
        let later = watch
            .jobs()
            .into_iter()
            .any(|j| j.uid != first.job_uid.clone().unwrap_or_default());
        Ok(later.then_some(()))
    })
    .await?;
    let created: Vec<Timestamp> = watch
        .jobs()
        .iter()
        .filter(|j| j.uid != first.job_uid.clone().unwrap_or_default())
        .filter_map(|j| j.created)
        .collect();
    ensure(
        &env,
        created
            .iter()
            .all(|c| *c >= released_at - SignedDuration::from_secs(1)),
        (
            "new Jobs created before the replaced run's pod was released",
            &created,
            released_at,
        ),
    )
    .await
}
