//! A deleted SingletonJob's prepared run (design §3.1, `Deleted`). Its Job is removed with it by
//! the garbage collector and never resumed by this controller, but its backstop claim would stay
//! live: a SingletonJob created again with the same job key before the instant would find the
//! period claimed and record it Deduplicated, a period lost to preparation (G2). So, from the
//! watch's last copy of the deleted object, the leader:
//!
//! ```text
//! W1 Mark   : the Job marked withdrawn if it is still there (a paused leader's late
//!             resume can no longer pass); a Job already resumed keeps its claim: it ran  G1
//! W2+W3     : the claim archived and its token retired                                 G2, G3
//! ```
//!
//! Nothing to record: the status went with the object. A deletion no replica saw (every
//! replica down) leaves the row live (design §8): `kubectl singleton rerun` runs the period.

use std::sync::Arc;
use std::time::Duration;

use super::{JobMark, job_of, mark, may_have_passed};
use crate::api::{RunRef, SingletonJob};
use crate::backstop::Availability;
use crate::context::Context;
use crate::decide::prepare::WithdrawReason;
use crate::kube_io::{self, Marked};
use crate::observe::backstop::Resolution;
use crate::{Error, Result};

/// How often the backstop is tried before the claim is left live (with a warning).
const TRIES: u32 = 3;
/// The wait between two tries.
const RETRY: Duration = Duration::from_secs(2);

/// Withdraws `sj`'s prepared run, if its last copy has one, in a task of its own (the watch
/// that saw the deletion must not wait). Only while this replica leads.
pub fn withdraw_deleted(ctx: &Arc<Context>, sj: &SingletonJob) {
    let Some(run) = sj.status.as_ref().and_then(|s| s.prepared.clone()) else {
        return;
    };
    if ctx.gate.check().is_err() {
        return;
    }
    let (ctx, sj) = (ctx.clone(), sj.clone());
    let task = async move {
        match withdraw(&ctx, &sj, &run).await {
            Ok(true) => {
                crate::metrics::global().run_withdrawn(&sj, WithdrawReason::Deleted.name());
                tracing::info!(sj = %sj.key(), job = %run.job_name, token = run.token, "the deleted SingletonJob's prepared run was withdrawn: its token retired, its backstop claim archived");
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(sj = %sj.key(), job = %run.job_name, token = run.token, error = %e, "could not withdraw the deleted SingletonJob's prepared run: its backstop claim stays live (kubectl singleton rerun runs the period)");
            }
        }
        // The connection `resolve` opened for a SingletonJob that is gone.
        ctx.backstops.forget(&sj.key());
    };
    tokio::spawn(task);
}

/// W1 to W3; whether the claim was withdrawn (false: nothing to withdraw, or it may have run).
async fn withdraw(ctx: &Context, sj: &SingletonJob, run: &RunRef) -> Result<bool> {
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let reason = WithdrawReason::Deleted;
    // W1 (G1).
    let marked = match &run.job_uid {
        Some(uid) => kube_io::withdraw_job(ctx, ns, &run.job_name, uid, reason.name()).await?,
        None => Marked::Gone,
    };
    let withdrawn = match marked {
        Marked::Withdrawn => true,
        Marked::Not => matches!(
            mark(job_of(ctx, sj, run, &[]).await?.as_ref()),
            JobMark::Withdrawn(_)
        ),
        // Gone before its instant: never resumed. Once the instant may have passed it may have
        // been, and run: its claim is its run's (G1).
        Marked::Gone => !may_have_passed(&ctx.clock.fresh().await, run),
    };
    if !withdrawn {
        return Ok(false);
    }
    // W2+W3 (G2, G3).
    let key = sj.backstop_key();
    for attempt in 1..=TRIES {
        ctx.gate.check()?;
        let db = match Box::pin(crate::observe::backstop::resolve(ctx, sj)).await {
            Resolution::Resolved(r) => r.db,
            Resolution::Later(_) => Availability::Unavailable("busy".into()),
        };
        match db {
            Availability::NotConfigured => return Ok(true),
            Availability::Ready(b) => {
                b.withdraw(&key, run.period.0, run.token, ns, reason.name())
                    .await?;
                return Ok(true);
            }
            Availability::Unavailable(why) if attempt == TRIES => {
                return Err(Error::Backstop(why));
            }
            Availability::Unavailable(_) => tokio::time::sleep(RETRY).await,
        }
    }
    Ok(false)
}
