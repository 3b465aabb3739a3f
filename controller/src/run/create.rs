//! Steps 5 and 6 of the run protocol ([`super`]): the runs a claim replaces are deleted, then
//! the claim's Job is created, suspended; and what a taken name or a refused create lead to.

use futures::future::BoxFuture;
use k8s_openapi::api::batch::v1::Job;

use super::decided;
use crate::api::{Outcome, ReplacedRun, RunRef, SingletonJob};
use crate::backstop::Availability;
use crate::context::Context;
use crate::decide::reason;
use crate::job;
use crate::kube_io::{self, Propagation};
use crate::lanes::Lane;
use crate::naming;
use crate::schedule::Window;
use crate::{Error, Result};

/// Step 5 for one replaced run: its Job goes, and, foreground, its pods before it. Whether this
/// call deleted it (false: it was gone already, or the name is another Job's).
pub(super) async fn delete_replaced(ctx: &Context, ns: &str, old: &ReplacedRun) -> Result<bool> {
    let fg = Propagation::Foreground;
    match &old.job_uid {
        Some(uid) => kube_io::delete_job_uid(ctx, ns, &old.job_name, uid, fg, Lane::Create).await,
        None => kube_io::delete_job_named(ctx, ns, &old.job_name, fg, Lane::Create).await,
    }
}

/// Step 5 without a fence (G5, F13): whether the replaced runs' Jobs are gone. A Job deleted in
/// the foreground stays until its pods are gone, so while it exists its pods may still write,
/// and nothing would refuse them: the new run waits ([`Error::Stopping`]), up to its wait bound;
/// then the period is decided Missed (returns false).
pub(super) async fn replaced_gone(
    ctx: &Context,
    fresh: &SingletonJob,
    claim: &RunRef,
    db: &Availability,
) -> Result<bool> {
    let ns = fresh.metadata.namespace.clone().unwrap_or_default();
    for old in &claim.replaces {
        let Some(job) = kube_io::get_job(ctx, &ns, &old.job_name, Lane::Create).await? else {
            continue;
        };
        if old.job_uid.is_some() && job.metadata.uid != old.job_uid {
            continue;
        }
        if super::claim::past_wait_bound(fresh, claim) {
            let note = format!(
                "the replaced run's Job {} was still stopping at the period's wait bound; without a backstop to fence it, the new run never started beside it",
                old.job_name
            );
            let d = decided::Decision::new(Outcome::Missed, reason::REPLACED_RUN_RUNNING, note);
            decided::decide_without_job(ctx, fresh, claim, d, db.ready()).await?;
            return Ok(false);
        }
        return Err(Error::Stopping(old.job_name.clone()));
    }
    Ok(true)
}

/// Where the claim's period sits in the schedule, told to its workload: by the schedule as the
/// fresh SingletonJob has it (its shift floor kept, as the decision used it). A schedule that
/// cannot be read now (a calendar deleted since the claim) leaves only the period's own values:
/// the run goes on, as its claim was decided.
fn window(ctx: &Context, fresh: &SingletonJob, claim: &RunRef) -> Window {
    let period = claim.period.0;
    let floor = fresh.status.as_ref().and_then(|s| s.shifts_after.as_ref());
    match ctx.schedule_of(fresh) {
        Ok(s) => s.with_shift_floor(floor.map(|t| t.0)).window(period),
        Err(e) => {
            tracing::warn!(sj = %fresh.key(), error = %e, "the schedule cannot be read: the run is told only its period");
            Window::unknown(period)
        }
    }
}

/// How many times step 6 retries a create whose name was taken by a Job it removed.
const CREATES: usize = 2;

/// Step 6: creates the claim's Job, suspended. Returns its uid, or None when the period was
/// decided without a Job (the API server rejects the Job, or its name is taken by another run).
pub(super) async fn create(
    ctx: &Context,
    fresh: &SingletonJob,
    claim: &RunRef,
    db: &Availability,
) -> Result<Option<String>> {
    let ns = fresh.metadata.namespace.clone().unwrap_or_default();
    // On the heap: a Job is kilobytes, and this future waits in a lane with it.
    let mut job = Box::new(job::for_run(fresh, claim, &window(ctx, fresh, claim))?);
    job::stop_at_deadline(&mut job, fresh, claim.period.0, jiff::Timestamp::now());
    if let Some(spec) = job.spec.as_mut() {
        spec.suspend = Some(true);
    }
    for _ in 0..CREATES {
        match kube_io::create_job(ctx, &job, super::lane(claim, Lane::Create)).await? {
            Ok(created) => {
                let uid =
                    created.metadata.uid.clone().ok_or_else(|| {
                        Error::Conflict(format!("Job {} has no uid", claim.job_name))
                    })?;
                if created.spec.as_ref().and_then(|s| s.suspend) != Some(true) {
                    not_suspended(ctx, fresh, claim, &uid, db).await?;
                    return Ok(None);
                }
                return Ok(Some(uid));
            }
            // The API server will never accept this Job: the period is decided, as Failed,
            // rather than retried forever with the claim blocking every later period (G2).
            Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => {
                let note = format!(
                    "the API server rejected Job {}: {}",
                    claim.job_name, s.message
                );
                let d = decided::Decision::new(Outcome::Failed, reason::JOB_REJECTED, note);
                decided::decide_without_job(ctx, fresh, claim, d, db.ready()).await?;
                return Ok(None);
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let Some(existing) =
                    kube_io::get_job(ctx, &ns, &claim.job_name, Lane::Create).await?
                else {
                    continue; // deleted meanwhile: create again
                };
                match name_taken(ctx, fresh, claim, &existing, db).await? {
                    Taken::Ours(uid) => return Ok(Some(uid)),
                    Taken::Removed => continue,
                    Taken::Decided => return Ok(None),
                }
            }
            // Refused for now (a quota, an admission webhook down, the API server itself): retried
            // until the period's deadline, then decided, never blocking later periods for ever.
            Err(e) if super::claim::past_deadline(fresh, claim) => {
                let note = format!(
                    "Job {} could not be created before the starting deadline: {e}",
                    claim.job_name
                );
                let d = decided::Decision::new(Outcome::Missed, reason::JOB_NOT_CREATED, note);
                decided::decide_without_job(ctx, fresh, claim, d, db.ready()).await?;
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
    }
    // The name stays taken (a removed Job lingers behind a finalizer): retried, but not past the
    // wait bound, then decided (F10b: it would block every later period for ever).
    if super::claim::past_wait_bound(fresh, claim) {
        let note = format!(
            "the name of Job {} stayed taken (a Job removed for it did not go away) past the period's wait bound",
            claim.job_name
        );
        let d = decided::Decision::new(Outcome::Missed, reason::JOB_NOT_CREATED, note);
        decided::decide_without_job(ctx, fresh, claim, d, db.ready()).await?;
        return Ok(None);
    }
    Err(Error::Conflict(format!(
        "the name of Job {} stayed taken",
        claim.job_name
    )))
}

/// Step 6 when the API server returns the Job not suspended: admission (a mutating webhook, a
/// queue's) cleared `spec.suspend`, so its pods may start before any confirm (G1: only the
/// controller starts a run). In this order: its token is retired (its pods may have begun), the
/// period is decided Failed (JobNotSuspended) with an Event, which clears the claim, and only then
/// is the Job deleted by uid. Deleting first would free the period's name while the claim is
/// still pending: a replica completing it would create a second Job of the period with the same,
/// unretired token (the model check's `DeleteBeforeRetire`). Whoever stops here half-way leaves a
/// pending claim whose completion finds this Job, not its own, and decides the period; or a Job
/// of a decided period, which the sweep removes.
async fn not_suspended(
    ctx: &Context,
    fresh: &SingletonJob,
    claim: &RunRef,
    uid: &str,
    db: &Availability,
) -> Result<()> {
    let ns = fresh.metadata.namespace.clone().unwrap_or_default();
    let note = format!(
        "the API server returned Job {} not suspended: an admission webhook or policy cleared spec.suspend at create, so it could start before its claim was confirmed; the Job was deleted and the period is decided Failed (exempt the controller's Jobs from that mutation, or use a queue through jobTemplate.spec.suspend: true)",
        claim.job_name
    );
    tracing::warn!(sj = %fresh.key(), job = %claim.job_name, "{note}");
    let d = decided::Decision::new(Outcome::Failed, reason::JOB_NOT_SUSPENDED, note).started();
    decided::decide_without_job(ctx, fresh, claim, d, db.ready()).await?;
    let fg = Propagation::Foreground;
    kube_io::delete_job_uid(ctx, &ns, &claim.job_name, uid, fg, Lane::Create).await?;
    Ok(())
}

/// What a create that found its name taken does.
enum Taken {
    /// The Job is this claim's (an earlier attempt created it, suspended): adopt its uid.
    Ours(String),
    /// A suspended Job no claim knows (it never ran) was removed: create again.
    Removed,
    /// Another run's Job: the period is decided without a Job of this claim.
    Decided,
}

/// Step 6 when a Job of the claim's name exists. It carries this claim's token: an earlier
/// attempt (a retry, or the claimer that died) created it; nobody can have resumed it, since
/// resuming follows a winning confirm and the claim is still pending. A suspended Job of this
/// SingletonJob that no claim knows never ran: removed by uid. Anything else is another run's
/// Job (an earlier run of the period, or not ours at all): the period is decided with an outcome
/// and an Event instead of being retried for ever ahead of every later period.
fn name_taken<'a>(
    ctx: &'a Context,
    fresh: &'a SingletonJob,
    claim: &'a RunRef,
    existing: &'a Job,
    db: &'a Availability,
) -> BoxFuture<'a, Result<Taken>> {
    // Boxed: a rare path, kept out of its callers' futures (docs/performance.md).
    Box::pin(async move {
        let ns = fresh.metadata.namespace.clone().unwrap_or_default();
        let found = job::token(existing);
        let status = fresh.status.clone().unwrap_or_default();
        let owned = fresh
            .metadata
            .uid
            .as_deref()
            .and_then(|uid| crate::observe::OwnedJob::of(existing, uid));
        // Ours only if it is this SingletonJob's (its owner reference) Job for this very period,
        // still suspended and not released: a name and a token are predictable, so anyone who
        // may create Jobs here could otherwise pre-create the period's run (F11).
        let same_run = existing.metadata.annotations.as_ref().is_some_and(|a| {
            a.get(naming::LABEL_JOB) == fresh.metadata.name.as_ref()
                && a.get(naming::LABEL_PERIOD) == Some(&naming::period_rfc3339(claim.period.0))
        });
        if found == Some(claim.token)
            && same_run
            && let Some(job) = owned
                .as_ref()
                .filter(|j| j.suspended && j.release.pending())
        {
            return Ok(Taken::Ours(job.uid.clone()));
        }
        // The claim's own Job, started by someone else before its confirm (a create that came
        // back running and was not stopped yet, or a resumer): stopped as step 6 stops it.
        if found == Some(claim.token)
            && same_run
            && let Some(job) = owned
                .as_ref()
                .filter(|j| !j.suspended && j.release.pending() && !j.deleting)
        {
            not_suspended(ctx, fresh, claim, &job.uid, db).await?;
            return Ok(Taken::Decided);
        }
        if let Some(job) = owned
            .as_ref()
            .filter(|j| j.suspended && !crate::observe::known(&status, j))
        {
            tracing::warn!(job = %job.name, token = ?job.token, "removing a suspended Job no claim knows (it never ran) to create this claim's");
            let bg = Propagation::Background;
            kube_io::delete_job_uid(ctx, &ns, &job.name, &job.uid, bg, Lane::Create).await?;
            return Ok(Taken::Removed);
        }
        let token = found.map_or("no".to_string(), |t| t.to_string());
        let d = if same_run && owned.is_some() {
            let note = format!(
                "Job {} of period {} exists already with token {token}: the period ran before; no second Job created",
                claim.job_name,
                naming::period_rfc3339(claim.period.0)
            );
            decided::Decision::new(Outcome::Deduplicated, reason::JOB_EXISTS, note)
        } else {
            let note = format!(
                "a Job named {} that is not this SingletonJob's run (token {token}) exists; the period cannot run under that name",
                claim.job_name
            );
            decided::Decision::new(Outcome::Failed, reason::JOB_NAME_TAKEN, note)
        };
        decided::decide_without_job(ctx, fresh, claim, d, db.ready()).await?;
        Ok(Taken::Decided)
    })
}

/// How a confirmed run's Job is let run, from the SingletonJob's template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The controller resumes it.
    Controller,
    /// The template asks for suspended Jobs: a queueing system (Kueue) resumes them once
    /// admitted. The controller releases the Job to the queue after the confirm, adding the
    /// queue label it withheld at create (the template's value, if any).
    Queue(Option<String>),
}

impl Admission {
    /// The release patch's form of it.
    pub fn release(&self) -> kube_io::Release<'_> {
        match self {
            Admission::Controller => kube_io::Release::Resume,
            Admission::Queue(q) => kube_io::Release::Queue(q.as_deref()),
        }
    }
}

/// How `sj`'s runs are admitted (see [`Admission`]).
pub fn admission(sj: &SingletonJob) -> Admission {
    let Ok(template) = sj.spec.job_template.decode() else {
        return Admission::Controller;
    };
    if template.spec.and_then(|s| s.suspend) != Some(true) {
        return Admission::Controller;
    }
    let queue = template
        .metadata
        .and_then(|m| m.labels)
        .and_then(|mut l| l.remove(naming::LABEL_KUEUE_QUEUE));
    Admission::Queue(queue)
}
