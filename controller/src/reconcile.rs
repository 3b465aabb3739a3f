//! One reconcile of a SingletonJob, in the order of the flow:
//!
//! ```text
//! guard    : nothing to do with this copy (deleted, a standby, a confirm in flight, older
//!            than this process's own write)
//! observe  : the clocks, the backstop, the SingletonJob's own Jobs
//! first    : a broken lock, a half-done claim, a status behind its Jobs, a prepared run
//!            (resumed at its instant or withdrawn), Jobs no claim knows
//! decide   : the schedule, the template, the active runs' Jobs → decide::plan
//! record   : what the plan decided, the conditions (pure: crate::record)
//! operate  : trigger, rerun and backfill requests (crate::operate)
//! notify   : what came of the notifications' deliveries (crate::notify)
//! act      : claim and start a run (crate::run), or write the status
//! after    : Events, metrics, pruning, when to look again
//! ```
//!
//! The large steps are boxed: a reconcile's future is sized for its largest step, and in a
//! burst a hundred of them wait in the lanes at once (see docs/performance.md).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;

use crate::api::{HistoryEntry, LockPurpose, RunOrigin, RunRef, SingletonJob, SingletonJobStatus};
use crate::backstop::Availability;
use crate::clock::ClockState;
use crate::context::{Context, asked};
use crate::decide::ops::{self, OperationKind};
use crate::decide::prepare::lead::{self, Next};
use crate::decide::{self, JobState, Observed, Plan, Waiting};
use crate::lanes::Lane;
use crate::operate::{self, ManualGates, ManualRun, Operations};
use crate::record::{self, BackstopSeen, Facts};
use crate::schedule::Schedule;
use crate::{Result, observe, run, watch_decode};

pub async fn reconcile(sj: Arc<SingletonJob>, ctx: Arc<Context>) -> Result<Action> {
    if let Some(action) = guard(&sj, &ctx) {
        return Ok(action);
    }
    // An object the watch could not decode: said on itself, nothing scheduled (issue 34, N1).
    if let Some(why) = watch_decode::undecodable(&sj) {
        return watch_decode::report(&ctx, &sj, why).await;
    }
    crate::metrics::global().undecodable(&sj, false);
    let _timer = crate::metrics::global().reconcile_timer();
    // Events a failover left pending are sent by the new leader (at least once).
    ctx.notifier.offer(&sj, sj.status.as_ref());

    // Observe. A verdict on the clocks no older than --clock-check-seconds (G4; at rest none is
    // sought), and a period is due when the earliest time the API server's clock may show has
    // reached it too, so no Job is ever stamped before its instant (G4).
    let clock = ctx.clock.fresh().await;
    let now = clock.due_now(Timestamp::now());
    let resolved = match Box::pin(observe::backstop::resolve(&ctx, &sj)).await {
        observe::backstop::Resolution::Resolved(r) => r,
        // Other probes of its namespace's backstops are in flight, or its namespace's database
        // time is spent: this one waits outside the reconcile slots, so a namespace of
        // unreachable or slow databases cannot hold them all (issue 19; issue 34, N3).
        observe::backstop::Resolution::Later(wait) => return Ok(Action::requeue(wait)),
    };
    // `_turn` is held to the end of the reconcile: its database work counts against its
    // namespace's share.
    let observe::backstop::Resolved {
        db,
        retry_at,
        turn: _turn,
    } = resolved;
    if let Availability::Ready(b) = &db {
        Box::pin(report_rejections(&ctx, &sj, b)).await;
    }

    if let Some(action) = Box::pin(first(&ctx, &sj, &db)).await? {
        return Ok(action);
    }
    let owned = observe::owned(&sj, ctx.jobs.state().iter().map(|j| j.as_ref()));
    let status = sj.status.clone().unwrap_or_default();
    if let Some(behind) = observe::behind(&status, &owned) {
        return Box::pin(raise_to_jobs(&ctx, &sj, status, behind, now)).await;
    }
    // A run prepared ahead of its instant: resumed at it (never before, G4), or withdrawn.
    let prepared = run::prepared::settle(&ctx, &sj, &owned, &clock, now, &db);
    if let Some(action) = Box::pin(prepared).await? {
        return Ok(action);
    }
    if Box::pin(run::sweep::check_jobs(&ctx, &sj, &status, &owned, &db, now)).await? {
        return Ok(Action::await_change());
    }

    let seen = Seen {
        clock,
        now,
        db,
        backstop_retry: retry_at,
        owned,
    };
    Box::pin(decide_and_act(&ctx, &sj, status, seen)).await
}

/// Whether this copy is to be left alone; then what to do instead.
fn guard(sj: &SingletonJob, ctx: &Arc<Context>) -> Option<Action> {
    if sj.metadata.deletion_timestamp.is_some() {
        // Owner references garbage-collect the Jobs; a prepared run's claim is withdrawn.
        ctx.forget(sj);
        run::prepared::withdraw_deleted(ctx, sj);
        return Some(Action::await_change());
    }
    // A standby keeps its caches warm but decides nothing: everything is reconciled when the
    // gate opens.
    if ctx.gate.check().is_err() {
        return Some(Action::await_change());
    }
    // It waits for a failing backstop, its status says so, and no user changed it since: the
    // watch's echo of our own write is not looked at before the backstop's next probe.
    if let Some(uid) = sj.metadata.uid.as_deref()
        && let Some(at) = ctx
            .backstop_health
            .is_hushed(uid, asked(sj), tokio::time::Instant::now())
    {
        return Some(Action::requeue(
            at.saturating_duration_since(tokio::time::Instant::now()),
        ));
    }
    // This SingletonJob's run is being confirmed (steps 7 and 8, in a task of their own): the
    // status read here is about to change; the task asks for a reconcile when it is done.
    if ctx.confirming.contains(sj) {
        return Some(Action::await_change());
    }
    // A cached copy from before this process confirmed its own claim (a Job event can trigger a
    // reconcile before the watch delivers our confirm, which triggers one of its own): acting on
    // it would claim or complete again from an old resourceVersion, costing a request and a 409.
    let status = sj.status.clone().unwrap_or_default();
    ctx.own_writes
        .predates(sj, &status)
        .then(Action::await_change)
}

/// What was observed, for the rest of the reconcile.
struct Seen {
    clock: ClockState,
    now: Timestamp,
    db: Availability,
    /// The backstop is unavailable and not probed again before this instant.
    backstop_retry: Option<tokio::time::Instant>,
    owned: Vec<observe::OwnedJob>,
}

/// A rise of the backstop's count of refused stale writes is news for a human.
async fn report_rejections(ctx: &Context, sj: &SingletonJob, b: &crate::backstop::Backstop) {
    if let Some((new, total)) = observe::backstop::new_rejections(ctx, sj, b).await {
        let note = format!(
            "the backstop refused {new} write(s) carrying a stale fencing token ({total} in all): a paused or replaced run tried to write"
        );
        ctx.events
            .publish(
                sj,
                EventType::Warning,
                "StaleTokenRefused",
                "ObserveFence",
                note,
            )
            .await;
    }
}

/// What goes before any new run: a broken lock (asked for because a holder is stuck; it clears a
/// half-done claim too), then a claim left half-done by a replica that died, finished with its
/// name and token.
async fn first(ctx: &Arc<Context>, sj: &SingletonJob, db: &Availability) -> Result<Option<Action>> {
    if let Some(req) = ops::pending(sj, OperationKind::BreakLock) {
        return operate::break_lock(ctx, sj, req, db).await.map(Some);
    }
    if let Some(b) = db.ready()
        && Box::pin(run::decided::settle(ctx, sj, b)).await?
    {
        return Ok(Some(Action::await_change()));
    }
    let Some(claim) = sj.status.as_ref().and_then(|s| s.pending_claim.clone()) else {
        return Ok(None);
    };
    let span = run::span(sj, &claim);
    let complete = run::complete_claim(ctx, sj, claim, db, run::Source::Cache);
    tracing::Instrument::instrument(Box::pin(complete), span).await?;
    // Its confirm asks for the next reconcile when done; a period decided without a Job comes
    // back through the watch of that status write.
    Ok(Some(Action::await_change()))
}

/// The status is behind the SingletonJob's own Jobs (wiped by hand, or an etcd restore): it is
/// raised to them ([`record::raise_to_jobs`]) with a Warning Event, and nothing else happens in
/// this reconcile; the next one goes on from the raised status.
async fn raise_to_jobs(
    ctx: &Context,
    sj: &SingletonJob,
    mut status: SingletonJobStatus,
    behind: observe::Behind,
    now: Timestamp,
) -> Result<Action> {
    let fingerprint = match ctx.schedule_of(sj) {
        Ok(schedule) => decide::fingerprint_with(&sj.spec, &schedule),
        Err(_) => decide::fingerprint(&sj.spec),
    };
    let generation = sj.metadata.generation;
    let message = record::raise_to_jobs(&mut status, behind, fingerprint, generation, now);
    run::write_status(ctx, sj, status, Lane::Background).await?;
    ctx.events
        .publish(
            sj,
            EventType::Warning,
            "StatusBehind",
            "ObserveJobs",
            message,
        )
        .await;
    Ok(Action::requeue(Duration::ZERO))
}

/// What was decided, for the rest of the reconcile.
struct Decided {
    schedule: Schedule,
    template: std::result::Result<(), String>,
    blocked: Option<Waiting>,
    created: Timestamp,
    plan: Plan,
}

/// Decide, record, operate, act, and what comes after.
async fn decide_and_act(
    ctx: &Arc<Context>,
    sj: &SingletonJob,
    mut status: SingletonJobStatus,
    seen: Seen,
) -> Result<Action> {
    let now = seen.now;
    status.observed_generation = sj.metadata.generation;
    let Some(schedule) = Box::pin(parse_schedule(ctx, sj, &mut status, now)).await? else {
        // Nothing will change until the spec does.
        return Ok(Action::await_change());
    };
    let schedule = shift_floor(sj, &mut status, schedule, now);
    let template = Box::pin(judge_template(ctx, sj, &mut status, now)).await?;
    let states = Box::pin(observe::runs::active_job_states(ctx, sj, &status.active)).await?;
    let blocked = blocked(sj, &seen.clock, &template, &seen.db);
    let created = sj.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    // G3, F3: no outcome without its token's retirement (Correctness, backstop unavailable).
    let hold =
        matches!(seen.db, Availability::Unavailable(_)) && sj.purpose() == LockPurpose::Correctness;
    // A finished run held is recorded at the backstop's next probe: look again then.
    let mut holding = hold && states.values().any(|s| *s != JobState::Active);
    let held;
    let states = if hold {
        held = decide::hold_outcomes(&states);
        &held
    } else {
        &states
    };
    let plan = plan(sj, &schedule, &status, now, created, blocked, states);
    // So is a due period that waits for the backstop: the plan's next instant may be a year
    // away, and a reconcile that writes nothing (its status already says Unavailable) gets no
    // echo from the watch to look again sooner (the burst-pause stall, CI 2026-12-06).
    holding |= plan.waiting == Some(Waiting::BackstopUnavailable);
    let decided = Decided {
        schedule,
        template,
        blocked,
        created,
        plan,
    };

    let (new_entries, ended) =
        Box::pin(record(ctx, sj, &mut status, &seen, &decided, states)).await?;
    let (manual, notes) = Box::pin(operations(sj, &mut status, &seen, &decided)).await?;
    let gave_up = settle_notifications(ctx, sj, &mut status);
    let operating = ops::in_progress(&status.operations);
    let ahead = prepare_next(ctx, sj, &mut status, &seen, &decided, operating);
    let plan = &decided.plan;
    let started = Box::pin(act(ctx, sj, status, plan, manual, ahead, &seen.db)).await?;
    Box::pin(after(ctx, sj, &new_entries, notes, ended, started.as_ref())).await?;
    Box::pin(notifications_given_up(ctx, sj, gave_up)).await;
    Box::pin(late_and_failing(ctx, sj, plan)).await?;
    Box::pin(lift_suspension(ctx, sj, &decided, now)).await?;

    // A manual run just started: look again at once (a backfill goes on, or waits for it). An
    // operation waiting on the clock or the backstop is looked at again shortly; one waiting for
    // a run to finish is woken by that Job's change as well.
    if let Some(at) = plan.wake_at {
        ctx.clock.prepare(at);
    }
    let hold = backstop_wait(&decided, &seen);
    if !hold.is_zero()
        && started.is_none()
        && !operating
        && let Some(uid) = sj.metadata.uid.as_deref()
    {
        // The echo of this status write changes nothing until the backstop's next probe.
        let until = tokio::time::Instant::now() + hold;
        ctx.backstop_health.hush(uid, asked(sj), until);
    }
    Ok(next_look(
        wake(plan, ahead).map(|at| until(now, at)),
        hold,
        holding,
        started.is_some(),
        operating,
    ))
}

/// When the plan wants to look again, or earlier when the next period's preparation may begin
/// (`ahead` is decided with the adaptive lead: a burst's preparation begins earlier).
fn wake(plan: &Plan, ahead: Next) -> Option<Timestamp> {
    match ahead {
        Next::At(p) => Some(plan.wake_at.map_or(p.from, |w| w.min(p.from))),
        _ => plan.wake_at,
    }
}

/// F9: an edit of the schedule or its excluded days moves no period decided before it. Keeps
/// the floor in `status.shiftsAfter` and returns the schedule that honours it.
fn shift_floor(
    sj: &SingletonJob,
    status: &mut SingletonJobStatus,
    schedule: Schedule,
    now: Timestamp,
) -> Schedule {
    let fp = decide::fingerprint_with(&sj.spec, &schedule);
    let floor = decide::shift_floor(
        &fp,
        status.schedule_fingerprint.as_deref(),
        status.decided_through.as_ref().map(|t| t.0),
        status.shifts_after.as_ref().map(|t| t.0),
        now,
    );
    status.shifts_after = floor.map(Into::into);
    schedule.with_shift_floor(floor)
}

/// When to look again: at the plan's next instant (not before the backstop's next probe when
/// waiting on it), at the probe when a finished run's outcome is held (F3) or a due period
/// waits for the backstop (`holding`), at once after a start, and shortly while an operation
/// is in progress.
fn next_look(
    wake: Option<Duration>,
    hold: Duration,
    holding: bool,
    started: bool,
    operating: bool,
) -> Action {
    let wake = wake.map(|w| w.max(hold));
    let wake = match holding {
        true => Some(wake.map_or(hold, |w| w.min(hold)).max(HELD_RETRY)),
        false => wake,
    };
    let operating = if started {
        Some(Duration::ZERO)
    } else {
        operating.then_some(operate::RETRY)
    };
    match (wake, operating) {
        (Some(a), Some(b)) => Action::requeue(a.min(b)),
        (a, b) => a.or(b).map_or_else(Action::await_change, Action::requeue),
    }
}

/// Record: what the plan decided goes into `status` (a finished run's token retired in the
/// backstop first, G3, so that no copy of it can pass the fence from now on), with the next
/// instants and the conditions. Returns the new history entries and the `Ended` condition's
/// Event if it turned True: both published only once the status is written.
async fn record(
    ctx: &Context,
    sj: &SingletonJob,
    status: &mut SingletonJobStatus,
    seen: &Seen,
    decided: &Decided,
    states: &HashMap<String, JobState>,
) -> Result<(Vec<HistoryEntry>, Option<operate::Note>)> {
    let (now, plan, db) = (seen.now, &decided.plan, &seen.db);
    if let Some(b) = db.ready()
        && let Some(token) = plan.finished.iter().map(|(r, _, _)| r.token).max()
    {
        ctx.gate.check()?;
        Box::pin(run::retire(sj, b, token)).await?;
        let outcomes: Vec<_> = plan
            .finished
            .iter()
            .map(|(r, outcome, _)| (r.period.0, r.token, *outcome))
            .collect();
        Box::pin(run::record_outcomes(sj, b, &outcomes)).await;
    }
    let new_entries = record::apply_plan(&sj.spec, status, plan, states, now);
    let jitter = |t| sj.jitter(t);
    // As the claim this reconcile may write will count it (run::start), in the same write.
    let run_count = status.run_count + u64::from(plan.start.is_some());
    let left = sj.spec.max_runs().map(|max| max.saturating_sub(run_count));
    let next = record::next_times(status, &decided.schedule, jitter, left, now);
    crate::metrics::global().next_run(sj, next);
    let facts = Facts {
        schedule: &decided.schedule.expr(),
        time_zone: sj.spec.time_zone.as_deref().unwrap_or("UTC"),
        suspended: sj.spec.suspend.unwrap_or(false),
        suspension: sj.spec.suspension.as_ref(),
        suspended_after_failures: status.suspended_after_failures.is_some(),
        clock: &seen.clock,
        backstop: seen_backstop(db),
        waiting: plan.waiting.or(decided.blocked),
        generation: sj.metadata.generation,
        now,
    };
    let standing = decide::bounds::standing(
        &sj.spec,
        &decided.schedule,
        plan.decided_through.unwrap_or(decided.created),
        run_count,
        decided.created,
        now,
    );
    if record::set_conditions(status, &facts)
        && let Availability::Unavailable(why) = db
    {
        let note = why.clone();
        ctx.events
            .publish(
                sj,
                EventType::Warning,
                "BackstopUnavailable",
                "ConnectBackstop",
                note,
            )
            .await;
    }
    // After the others: a schedule whose bounds hold no period is not a valid one.
    let ended = record::bounds_condition(status, &sj.spec, standing.as_ref(), run_count, &facts);
    if let Some(b) = db.ready()
        && record::claims_recorded_stale(status, &b.target_id())
    {
        let fence = Box::pin(b.fence(&sj.backstop_key())).await?;
        record::mark_claims_recorded(status, b.target_id(), fence, decided.created, now);
    } else if matches!(db, Availability::NotConfigured) {
        status.claims_recorded = None;
    }
    Ok((new_entries, ended))
}

/// Operations users asked for (trigger, rerun, backfill) come after the schedule's own run: none
/// is looked at when the plan starts one. The manual run to start now, if any, and the Events to
/// publish after the write.
async fn operations(
    sj: &SingletonJob,
    status: &mut SingletonJobStatus,
    seen: &Seen,
    decided: &Decided,
) -> Result<(Option<ManualRun>, Vec<operate::Note>)> {
    let plan = &decided.plan;
    if plan.start.is_some() {
        return Ok((None, Vec::new()));
    }
    let mut ops = Operations {
        sj,
        status,
        schedule: &decided.schedule,
        decided_through: plan.decided_through.unwrap_or(seen.now),
        gates: ManualGates {
            blocked: decided.blocked,
            template: &decided.template,
            active: &plan.still_active,
            owned: &seen.owned,
        },
        db: &seen.db,
        now: seen.now,
        notes: Vec::new(),
    };
    let manual = Box::pin(ops.next()).await?;
    Ok((manual, ops.notes))
}

/// The schedule, or, when it does not parse, the conditions and an Event saying so (written
/// once per generation or change).
async fn parse_schedule(
    ctx: &Context,
    sj: &SingletonJob,
    status: &mut SingletonJobStatus,
    now: Timestamp,
) -> Result<Option<Schedule>> {
    let err = match ctx.schedule_of(sj) {
        Ok(s) => return Ok(Some(s)),
        Err(err) => err,
    };
    let msg = err.to_string();
    let generation = sj.metadata.generation;
    let changed = record::invalid_schedule(status, &msg, generation, now);
    crate::metrics::global().next_run(sj, None);
    if changed || sj.status.as_ref().map(|s| s.observed_generation) != Some(generation) {
        run::write_status(ctx, sj, status.clone(), Lane::Background).await?;
        ctx.events
            .publish(
                sj,
                EventType::Warning,
                "InvalidSchedule",
                "ParseSchedule",
                msg,
            )
            .await;
    }
    Ok(None)
}

/// The API server itself judges the Job template, once per spec generation (a dry-run create), so
/// a template it would reject is reported before any period is claimed for it.
async fn judge_template(
    ctx: &Context,
    sj: &SingletonJob,
    status: &mut SingletonJobStatus,
    now: Timestamp,
) -> Result<std::result::Result<(), String>> {
    let generation = sj.metadata.generation;
    let judged = record::conditions::for_generation(
        &status.conditions,
        record::conditions::JOB_TEMPLATE_VALID,
        generation,
    );
    let verdict = match judged {
        Some(c) => (c.status == "True")
            .then_some(())
            .ok_or_else(|| c.message.clone()),
        None => Box::pin(crate::kube_io::dry_run_job(ctx, sj, now)).await?,
    };
    if record::template_verdict(status, &verdict, generation, now)
        && let Err(msg) = &verdict
    {
        let note = msg.clone();
        ctx.events
            .publish(
                sj,
                EventType::Warning,
                "JobTemplateRejected",
                "ValidateTemplate",
                note,
            )
            .await;
    }
    Ok(verdict)
}

/// How long a SingletonJob whose runs wait for its backstop need not be looked at: until the
/// backstop's next probe (its backoff), since no period can start before. Without this, a
/// namespace of every-second SingletonJobs behind a dead database is reconciled (and its status
/// written) every second each, for nothing. A period's deadline passing meanwhile is recorded
/// at that next look, a little late, never lost (G2). A backstop that could not even be tried
/// (its Secret unreadable or invalid: no probe, so no backoff) is looked at again after the
/// longest backoff: a Secret fixed meanwhile triggers no reconcile of its own.
fn backstop_wait(decided: &Decided, seen: &Seen) -> Duration {
    match (decided.blocked, seen.backstop_retry) {
        (Some(Waiting::BackstopUnavailable), Some(at)) => {
            at.saturating_duration_since(tokio::time::Instant::now())
        }
        (Some(Waiting::BackstopUnavailable), None) => crate::backstop::health::MAX_BACKOFF,
        _ => Duration::ZERO,
    }
}

/// Why no run may start now, if so.
fn blocked(
    sj: &SingletonJob,
    clock: &ClockState,
    template: &std::result::Result<(), String>,
    db: &Availability,
) -> Option<Waiting> {
    let correctness = sj.purpose() == LockPurpose::Correctness;
    if !clock.trusted {
        Some(Waiting::ClockUntrusted)
    } else if template.is_err() {
        Some(Waiting::JobTemplateInvalid)
    } else if matches!(db, Availability::Unavailable(_)) && correctness {
        Some(Waiting::BackstopUnavailable)
    } else {
        None
    }
}

/// [`decide::plan`] over this reconcile's inputs (also what tests/hostile_input.rs decides with).
pub fn plan(
    sj: &SingletonJob,
    schedule: &Schedule,
    status: &SingletonJobStatus,
    now: Timestamp,
    created: Timestamp,
    blocked: Option<Waiting>,
    states: &HashMap<String, JobState>,
) -> Plan {
    // The period's jitter follows the backstop's job key, as the idempotency key does: two
    // clusters' SingletonJobs of one jobKey (different names) pick the same offset (F8).
    let key = sj.backstop_key();
    let obs = Observed {
        now,
        key: &key,
        consecutive_failures: status.consecutive_failures,
        run_count: status.run_count,
        created,
        blocked,
        job_states: states,
    };
    decide::plan(
        &sj.spec,
        schedule,
        status.decided_through.as_ref().map(|t| t.0),
        status.schedule_fingerprint.as_deref(),
        &status.active,
        &obs,
    )
}

/// The backstop as the conditions see it.
fn seen_backstop(db: &Availability) -> BackstopSeen {
    match db {
        Availability::NotConfigured => BackstopSeen::NotConfigured,
        Availability::Ready(_) => BackstopSeen::Ready,
        Availability::Unavailable(why) => BackstopSeen::Unavailable(why.clone()),
    }
}

/// Whether to prepare the next period ahead of its instant (issue 33), and the `Preparation`
/// condition that says how this SingletonJob's runs are prepared. `status` is what this
/// reconcile writes (the plan's records applied); `operating`: a user's operation is under way.
///
/// Decided with the base lead first; a burst due at the same instant may raise the lead
/// ([`adapt`]). The condition says the base lead and its clamp only: the adaptive lead moves
/// with every SingletonJob of a burst, and a status write each time would cost the API server
/// the very requests the burst needs.
fn prepare_next(
    ctx: &Context,
    sj: &SingletonJob,
    status: &mut SingletonJobStatus,
    seen: &Seen,
    decided: &Decided,
    operating: bool,
) -> Next {
    let lead = lead::base_lead(&sj.spec, ctx.prepare_lead_seconds);
    let backstop = sj.spec.backstop.as_ref();
    let shared = backstop.is_some_and(|b| {
        (b.database().is_some() && !ctx.backstops.cluster().is_empty())
            || b.standby_delay_seconds.is_some()
    });
    let key = sj.backstop_key();
    let states = HashMap::new();
    let obs = Observed {
        now: seen.now,
        key: &key,
        consecutive_failures: status.consecutive_failures,
        run_count: status.run_count,
        created: decided.created,
        blocked: decided.blocked,
        job_states: &states,
    };
    let asked = ops::OperationKind::ALL
        .into_iter()
        .any(|kind| ops::pending(sj, kind).is_some());
    let ahead = lead::Ahead {
        spec: &sj.spec,
        schedule: &decided.schedule,
        status,
        plan: &decided.plan,
        obs: &obs,
        lead,
        shared,
        operation_pending: operating || asked,
        refused: ctx.refused_preparation(sj),
    };
    let base = lead::next(&ahead);
    let next = adapt(ctx, sj, &ahead, base);
    let generation = sj.metadata.generation;
    let spec_lead = sj.spec.prepare_lead_seconds.is_some();
    record::preparation(status, lead, shared, base, spec_lead, generation, seen.now);
    next
}

/// The next period's preparation with the adaptive lead (design §2.3): the SingletonJob is
/// registered as due at its next period's instant (`ctx.due`), and when the runs due then need
/// longer than its base lead at the rate the API server sustains, it is decided again with the
/// longer lead. `base` is [`lead::next`] with the base lead.
fn adapt(ctx: &Context, sj: &SingletonJob, a: &lead::Ahead<'_>, base: Next) -> Next {
    let me = ObjectRef::from_obj(sj);
    let instant = match base {
        Next::At(p) | Next::Now(p) => p.period,
        // A run prepared or being prepared still counts in its instant's burst until then.
        Next::Not(_) => match a
            .status
            .prepared
            .as_ref()
            .or(a.status.pending_claim.as_ref())
        {
            Some(run) if run.resume_at.is_some() => run.period.0,
            _ => {
                ctx.due.leave(&me);
                let largest = ctx.due.largest_lead(a.obs.now);
                crate::metrics::global().prepare_lead(largest);
                return base;
            }
        },
    };
    let requests = match sj.spec.backstop {
        Some(_) => lead::REQUESTS_PER_PREPARATION_WITH_BACKSTOP,
        None => lead::REQUESTS_PER_PREPARATION,
    };
    let now = a.obs.now;
    let (due, per_run) = ctx.due.enter(&me, instant, requests, now);
    let rate = ctx.lanes.sustained_rate();
    let max = SignedDuration::from_secs(ctx.prepare_max_lead_seconds.into());
    let burst = lead::burst_lead(max, due, per_run, rate);
    let adaptive = lead::adaptive_lead(a.lead, max, due, per_run, rate);
    let next = match base {
        Next::At(_) if adaptive > a.lead => match lead::next(&lead::Ahead {
            lead: adaptive,
            ..*a
        }) {
            // Not with the longer lead (the plan asked at the instant would not start it): at
            // the base lead's start it is looked at again, as without a burst.
            Next::Not(_) => base,
            longer => longer,
        },
        _ => base,
    };
    // Kept at the base lead, it is still taken as waiting with the adaptive one: woken for it,
    // it would only decide the same again.
    let waits = matches!(next, Next::At(_)).then_some(adaptive);
    ctx.due.led(&me, burst, adaptive, waits, now);
    crate::metrics::global().prepare_lead(ctx.due.largest_lead(now));
    next
}

/// A manual run this reconcile started: how it came about, who asked, and its claim.
struct Started {
    origin: RunOrigin,
    by: Option<String>,
    claim: RunRef,
}

/// Act: claims and starts the scheduled run or the manual one, with `status` written in the same
/// compare-and-swap; else writes `status` if it changed.
async fn act(
    ctx: &Arc<Context>,
    sj: &SingletonJob,
    status: SingletonJobStatus,
    plan: &Plan,
    manual: Option<ManualRun>,
    ahead: Next,
    db: &Availability,
) -> Result<Option<Started>> {
    if let Some(period) = plan.start {
        let cause = run::Cause::Scheduled {
            replace: &plan.replace,
        };
        Box::pin(run::start(ctx, sj, status, period, cause, db)).await?;
        return Ok(None);
    }
    // The next period, ahead of its instant: resumed at it by run::prepared (never before, G4).
    if manual.is_none()
        && let Next::Now(p) = ahead
        && let Ok(schedule) = ctx.schedule_of(sj)
    {
        let basis = decide::prepare::basis(&sj.spec, &schedule);
        let cause = run::Cause::Prepared {
            resume_at: p.resume_at,
            basis: &basis,
        };
        Box::pin(run::start(ctx, sj, status, p.period, cause, db)).await?;
        return Ok(None);
    }
    if let Some(manual) = manual {
        let origin = manual.origin;
        let cause = manual.cause();
        let by = cause
            .operation()
            .and_then(|kind| kind.slot(&status.operations))
            .and_then(|o| o.requested_by.clone());
        let claim = Box::pin(run::start(ctx, sj, status, manual.period, cause, db)).await?;
        return Ok(Some(Started { origin, by, claim }));
    }
    if sj.status.as_ref() != Some(&status) {
        run::write_status(ctx, sj, status, Lane::Background).await?;
    }
    Ok(None)
}

/// After the write: Events and metrics of what was recorded, of the bounds, of the operations and
/// of a manual run started; then the history limits.
async fn after(
    ctx: &Context,
    sj: &SingletonJob,
    new_entries: &[HistoryEntry],
    notes: Vec<operate::Note>,
    ended: Option<operate::Note>,
    started: Option<&Started>,
) -> Result<()> {
    for e in new_entries {
        ctx.events.recorded(sj, e).await;
        crate::metrics::global().recorded(sj, e);
    }
    if let Some((type_, reason, note)) = ended {
        ctx.events.publish(sj, type_, reason, "Bounds", note).await;
    }
    let manual = started.map(|s| operate::started_note(s.origin, s.by.as_deref(), &s.claim));
    for (type_, reason, note) in notes.into_iter().chain(manual) {
        ctx.events.publish(sj, type_, reason, "Operate", note).await;
    }
    Box::pin(record::prune::prune_jobs(ctx, sj)).await
}

/// Notifications given up, with the delivery that gave up.
type GaveUp = Vec<(
    crate::api::PendingNotification,
    crate::decide::notify::Delivery,
)>;

/// What came of the notifications' deliveries, into `status` (written by this reconcile's act):
/// the ones given up, for their Events once written.
fn settle_notifications(
    ctx: &Context,
    sj: &SingletonJob,
    status: &mut SingletonJobStatus,
) -> GaveUp {
    let news = ctx.notifier.news(sj);
    crate::decide::notify::settle(ctx.notifier.targets(sj), status, &news)
}

/// An Event for each notification given up after `giveUpAfterSeconds`, once its status write is
/// done.
async fn notifications_given_up(ctx: &Context, sj: &SingletonJob, gave_up: GaveUp) {
    for (p, d) in gave_up {
        let why = match &d.fate {
            crate::decide::notify::Fate::GaveUp(e) => e.as_str(),
            _ => "",
        };
        let note = format!(
            "notification {} ({} of period {}) to {} given up after giveUpAfterSeconds: {why}",
            p.id,
            p.event.name(),
            crate::naming::period_rfc3339(p.entry.period.0),
            d.target
        );
        ctx.events
            .publish(sj, EventType::Warning, "NotificationFailed", "Notify", note)
            .await;
    }
}

/// Runs past their completion deadline get an Event and the metric, once each; reaching
/// `suspendAfterConsecutiveFailures` suspends the SingletonJob (after the status write, which
/// keeps the count until the suspension is seen, so a failed write here is tried again).
async fn late_and_failing(ctx: &Context, sj: &SingletonJob, plan: &Plan) -> Result<()> {
    let metrics = crate::metrics::global();
    for run in &plan.late {
        metrics.run_late(sj);
        let deadline = sj.spec.completion_deadline_seconds.unwrap_or_default();
        let note = format!(
            "run {} of period {} (token {}) has not succeeded within completionDeadlineSeconds ({deadline} s) of its instant",
            run.job_name,
            crate::naming::period_rfc3339(run.period.0),
            run.token
        );
        ctx.events
            .publish(
                sj,
                EventType::Warning,
                "RunLate",
                "CompletionDeadline",
                note,
            )
            .await;
    }
    if plan.suspend && Box::pin(crate::kube_io::suspend_sj(ctx, sj)).await? {
        metrics.suspended_after_failures(sj);
        let note = format!(
            "suspended after {} runs in a row failed (suspendAfterConsecutiveFailures); set spec.suspend to false to resume",
            plan.consecutive_failures
        );
        ctx.events
            .publish(
                sj,
                EventType::Warning,
                "SuspendedAfterFailures",
                "Suspend",
                note,
            )
            .await;
    }
    Ok(())
}

/// A suspension whose `suspension.until` has passed is lifted (`suspend: false`, no
/// `suspension`), after the status write that recorded the periods before it as Skipped: only
/// once every one of them is decided, so that none is left pending to start after the resume.
async fn lift_suspension(
    ctx: &Context,
    sj: &SingletonJob,
    decided: &Decided,
    now: Timestamp,
) -> Result<()> {
    let Some(until) = sj.spec.suspended_until().filter(|u| *u <= now) else {
        return Ok(());
    };
    let cursor = decided.plan.decided_through.unwrap_or(decided.created);
    let last_held = until
        .checked_sub(SignedDuration::from_nanos(1))
        .ok()
        .and_then(|t| decided.schedule.latest_at_or_before(t));
    if last_held.is_some_and(|p| p > cursor) {
        return Ok(());
    }
    if Box::pin(crate::kube_io::resume_sj(ctx, sj)).await? {
        let why = sj
            .spec
            .suspension
            .as_ref()
            .map(crate::api::Suspension::note)
            .unwrap_or_default();
        let note = format!("the suspension ({why}) ended; runs start again");
        ctx.events
            .publish(sj, EventType::Normal, "SuspensionEnded", "Resume", note)
            .await;
    }
    Ok(())
}

/// The shortest wait before a run whose outcome is held (F3) is looked at again.
const HELD_RETRY: Duration = Duration::from_secs(1);

/// Time from `now` until `at`, rounded up to the millisecond so a timer never fires before `at`.
fn until(now: Timestamp, at: Timestamp) -> Duration {
    let d = at.duration_since(now);
    if d <= SignedDuration::ZERO {
        return Duration::ZERO;
    }
    let ms = d.as_millis() as u64 + u64::from(d.subsec_nanos() % 1_000_000 != 0);
    Duration::from_millis(ms)
}
