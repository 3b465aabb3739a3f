//! The last line of defence against a second run, and the completion of a lost resume: held
//! against the status, the SingletonJob's own Jobs (see [`crate::observe::owned()`]) that no claim
//! knows are removed by uid, with an Event; confirmed runs whose Job is still suspended are
//! resumed.

use kube::ResourceExt;
use kube::runtime::events::EventType;

use crate::api::{SingletonJob, SingletonJobStatus};
use crate::context::Context;
use crate::kube_io::{self, Propagation};
use crate::lanes::Lane;
use crate::{Result, observe, run};

/// The last line of defence and the completion of a lost resume (see [`observe`]): Jobs of
/// decided periods that no claim knows are removed by uid, with an Event; confirmed runs whose
/// Job is still suspended are resumed.
pub async fn check_jobs(
    ctx: &Context,
    sj: &SingletonJob,
    status: &SingletonJobStatus,
    owned: &[observe::OwnedJob],
) -> Result<()> {
    let ns = sj.namespace().unwrap_or_default();
    for job in observe::unknown(status, owned) {
        let bg = Propagation::Background;
        if kube_io::delete_job_uid(ctx, &ns, &job.name, &job.uid, bg, Lane::Create).await? {
            let ran = if job.suspended {
                "it never ran"
            } else {
                "it was running: a second run of a decided period"
            };
            let note = format!(
                "removed Job {} (token {}): no claim knows it, its period is decided; {ran}",
                job.name,
                job.token.unwrap_or_default()
            );
            tracing::warn!(sj = %sj.key(), job = %job.name, uid = %job.uid, "{note}");
            ctx.events
                .publish(
                    sj,
                    EventType::Warning,
                    "UnknownJobRemoved",
                    "ObserveJobs",
                    note,
                )
                .await;
        }
    }
    let resume = observe::to_resume(status, owned, false);
    // Decoding the template is only worth it when there is something to resume.
    if resume.is_empty() || run::keeps_suspended(sj) {
        return Ok(());
    }
    for (name, uid) in resume {
        if ctx.resumed.contains(&uid) {
            continue;
        }
        if let Some(run) = status.active.iter().find(|r| r.job_name == name) {
            tracing::info!(sj = %sj.key(), job = %name, "resuming a confirmed run's Job (its resume was lost)");
            run::resume(ctx, sj, run, &uid, false).await?;
        }
    }
    Ok(())
}
