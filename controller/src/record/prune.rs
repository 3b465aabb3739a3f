//! Finished Jobs beyond the history limits are deleted, oldest first, by uid.

use kube::ResourceExt;

use crate::Result;
use crate::api::SingletonJob;
use crate::context::Context;
use crate::decide::JobState;
use crate::job;
use crate::kube_io::{self, Propagation};
use crate::lanes::Lane;

const DEFAULT_SUCCESS_LIMIT: i32 = 3;
const DEFAULT_FAILED_LIMIT: i32 = 1;

/// Deletes finished Jobs beyond the history limits, oldest first. Only Jobs whose outcome is
/// already recorded (not active, not a pending claim) are candidates.
pub async fn prune_jobs(ctx: &Context, sj: &SingletonJob) -> Result<()> {
    let ns = sj.namespace().unwrap_or_default();
    let uid = sj.uid().unwrap_or_default();
    let status = sj.status.clone().unwrap_or_default();
    let keep_ok = sj
        .spec
        .successful_jobs_history_limit
        .unwrap_or(DEFAULT_SUCCESS_LIMIT)
        .max(0) as usize;
    let keep_failed = sj
        .spec
        .failed_jobs_history_limit
        .unwrap_or(DEFAULT_FAILED_LIMIT)
        .max(0) as usize;
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for job in ctx.jobs.state() {
        let owned = job.namespace().as_deref() == Some(ns.as_str())
            && job.owner_references().iter().any(|o| o.uid == uid);
        let name = job.name_any();
        let busy = status.active.iter().any(|r| r.job_name == name)
            || status
                .pending_claim
                .as_ref()
                .is_some_and(|r| r.job_name == name);
        // A Job carrying a token above the status's was claimed after this copy of the status was
        // read (its claim may still be pending or its outcome unrecorded): never this copy's to
        // prune, as `observe::unknown` never removes one (found by the model check).
        let newer = job::token(&job).is_none_or(|t| t > status.fencing_token);
        if !owned || busy || newer {
            continue;
        }
        let Some(job_uid) = job.metadata.uid.clone() else {
            continue;
        };
        match job::state(&job) {
            JobState::Succeeded(at) => ok.push((at, name, job_uid)),
            JobState::Failed(at) => failed.push((at, name, job_uid)),
            _ => {}
        }
    }
    let bg = Propagation::Background;
    for (list, keep) in [(&mut ok, keep_ok), (&mut failed, keep_failed)] {
        list.sort();
        let excess = list.len().saturating_sub(keep);
        for (_, name, job_uid) in list.drain(..excess) {
            kube_io::delete_job_uid(ctx, &ns, &name, &job_uid, bg, Lane::Background).await?;
        }
    }
    Ok(())
}
