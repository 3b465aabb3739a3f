//! The run protocol: how one period becomes one Job. Read it top to bottom; each step names the
//! guarantee it serves (DESIGN.md G1 to G5).
//!
//! ```text
//! 1. Gate    : act only while this replica may (the leader, not shutting down)     G4
//! 2. Claim   : one status write, carrying the observed resourceVersion, records the
//!              period as decided and issues the next fencing token. A 409 means
//!              someone else acted: abort, re-read, decide again. This write is the
//!              linearisation point of the run.                                   G1, G3
//! 3. Replace : with concurrencyPolicy Replace, the old run is fenced by step 2's
//!              newer token, then its Job is deleted, before the new Job exists.   G5
//! 4. Create  : the Job's name is deterministic per period, so the API server
//!              refuses a second Job for the same period.                          G1
//! 5. Confirm : a second status write moves the claim to `active`. If we die
//!              between 2 and 5, whoever acts next finds `pendingClaim` and
//!              completes it with the same name and token (complete_claim).      G1, G2
//! ```

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};

use crate::api::{HistoryEntry, Outcome, RunRef, SingletonJob, SingletonJobStatus};
use crate::controller::Context;
use crate::decide::reason;
use crate::naming;
use crate::{Error, Result};

/// Claims `period` and starts its Job. `status` is the status to write with the claim (already
/// carrying this reconcile's records); `sj` must be the object as read, with its resourceVersion.
pub async fn start(
    ctx: &Context,
    sj: &SingletonJob,
    mut status: SingletonJobStatus,
    period: Timestamp,
    replace: &[RunRef],
) -> Result<RunRef> {
    // 1. Gate (G4): a replica that is not allowed to act must not write at all.
    ctx.gate.check()?;

    // 2. Claim (G1, G3). The token only increases: it is one more than the highest ever written
    //    to this status, and the write fails if anyone else wrote since we read.
    let now = Timestamp::now();
    let token = status.fencing_token + 1;
    let claim = RunRef {
        period: period.into(),
        token,
        job_name: naming::job_name(sj.metadata.name.as_deref().unwrap_or_default(), period),
        claimed_at: Some(now.into()),
    };
    status.fencing_token = token;
    status.decided_through = Some(period.into());
    status.pending_claim = Some(claim.clone());
    status.last_schedule_time = Some(period.into());
    let claimed = write_status(ctx, sj, status).await?;
    tracing::info!(sj = %sj.key(), period = %naming::period_rfc3339(period), token, epoch = ctx.gate.epoch(), "claimed period");

    // 3. Replace (G5): the old runs hold older tokens, already superseded by step 2; now stop them.
    for old in replace {
        delete_job(ctx, sj, &old.job_name).await?;
    }

    // 4 and 5.
    complete_claim(ctx, &claimed, claim.clone(), replace).await?;
    Ok(claim)
}

/// Steps 4 and 5 for a claim written earlier, possibly by another (dead) replica.
pub async fn complete_claim(
    ctx: &Context,
    sj: &SingletonJob,
    claim: RunRef,
    replaced: &[RunRef],
) -> Result<()> {
    ctx.gate.check()?;
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);

    // 4. Create (G1): the deterministic name makes a second Job for this period impossible. If the
    //    Job exists, it must be this claim's (same token); anything else is refused loudly.
    let job = naming::build_job(sj, claim.period.0, claim.token)?;
    match jobs.create(&PostParams::default(), &job).await {
        Ok(_) => {
            ctx.events.run_started(sj, &claim).await;
        }
        // The API server will never accept this Job: the period is decided, as Failed, rather than
        // retried forever with the claim blocking every later period (G2).
        Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => {
            let mut status = sj.status.clone().unwrap_or_default();
            status.pending_claim = None;
            status.last_result = Some(Outcome::Failed);
            let entry = HistoryEntry {
                period: claim.period.clone(),
                last_period: None,
                count: 1,
                outcome: Outcome::Failed,
                reason: Some(reason::JOB_REJECTED.into()),
                job_name: Some(claim.job_name.clone()),
                token: Some(claim.token),
                start_time: claim.claimed_at.clone(),
                finish_time: Some(Timestamp::now().into()),
            };
            status.history.insert(0, entry.clone());
            status.history.truncate(crate::controller::HISTORY_LIMIT);
            write_status(ctx, sj, status).await?;
            let note = format!(
                "the API server rejected Job {}: {}",
                claim.job_name, s.message
            );
            ctx.events
                .publish(
                    sj,
                    kube::runtime::events::EventType::Warning,
                    reason::JOB_REJECTED,
                    "CreateJob",
                    note,
                )
                .await;
            return Ok(());
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let existing = jobs.get(&claim.job_name).await?;
            let found = naming::job_token(&existing);
            if found != Some(claim.token) {
                return Err(Error::ForeignJob {
                    name: claim.job_name.clone(),
                    found,
                    expected: claim.token,
                });
            }
        }
        Err(e) => return Err(e.into()),
    }

    // 5. Confirm: the run is active; the claim is done.
    let mut status = sj.status.clone().unwrap_or_default();
    status.pending_claim = None;
    status
        .active
        .retain(|r| !replaced.iter().any(|o| o.job_name == r.job_name));
    status.active.push(claim.clone());
    status.active_count = status.active.len() as i32;
    let now = Timestamp::now();
    for old in replaced {
        status.history.insert(
            0,
            HistoryEntry {
                period: old.period.clone(),
                last_period: None,
                count: 1,
                outcome: Outcome::Replaced,
                reason: Some(reason::REPLACED.into()),
                job_name: Some(old.job_name.clone()),
                token: Some(old.token),
                start_time: old.claimed_at.clone(),
                finish_time: Some(now.into()),
            },
        );
    }
    status.history.insert(
        0,
        HistoryEntry {
            period: claim.period.clone(),
            last_period: None,
            count: 1,
            outcome: Outcome::Running,
            reason: None,
            job_name: Some(claim.job_name.clone()),
            token: Some(claim.token),
            start_time: claim.claimed_at.clone(),
            finish_time: None,
        },
    );
    status.history.truncate(crate::controller::HISTORY_LIMIT);
    write_status(ctx, sj, status).await?;
    Ok(())
}

/// Asks the API server whether it would accept this SingletonJob's Job (a dry-run create, which
/// runs validation and admission but stores nothing). `Ok(Err(message))` when it would not.
pub async fn dry_run_job(
    ctx: &Context,
    sj: &SingletonJob,
    now: Timestamp,
) -> Result<std::result::Result<(), String>> {
    let job = match naming::build_job(sj, now, 0) {
        Ok(job) => job,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match jobs.create(&pp, &job).await {
        // 409: a Job of that name exists, so the template itself was not the problem.
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => Ok(Err(s.message)),
        Err(e) => Err(e.into()),
    }
}

/// Writes `status` to `sj`'s status subresource with `sj`'s resourceVersion as precondition
/// (compare-and-swap). Returns the object as written, carrying the new resourceVersion.
pub async fn write_status(
    ctx: &Context,
    sj: &SingletonJob,
    status: SingletonJobStatus,
) -> Result<SingletonJob> {
    ctx.gate.check()?;
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let name = sj.metadata.name.as_deref().unwrap_or_default();
    let api: Api<SingletonJob> = Api::namespaced(ctx.client.clone(), ns);
    let mut obj = sj.clone();
    // Never write without a precondition: a missing resourceVersion would turn the PUT into a
    // blind overwrite and silently undo another replica's claim.
    if obj.metadata.resource_version.is_none() {
        return Err(Error::Conflict(format!(
            "{ns}/{name} read without a resourceVersion"
        )));
    }
    obj.status = Some(status);
    api.replace_status(name, &PostParams::default(), &obj)
        .await
        .map_err(|e| Error::from_write(e, &format!("singletonjob {ns}/{name} status")))
}

/// Deletes a run's Job and its pods (background propagation: the Job object goes at once).
pub async fn delete_job(ctx: &Context, sj: &SingletonJob, name: &str) -> Result<()> {
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    match jobs.delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
