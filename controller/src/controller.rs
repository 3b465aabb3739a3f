//! The reconcile loop: read what is, decide ([`crate::decide`]), act ([`crate::run`]), record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{self as kube_controller, Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;

use crate::api::{
    ClaimsRecorded, ConcurrencyPolicy, HistoryEntry, LockPurpose, OperationPhase, Outcome,
    RunOrigin, RunRef, SingletonJob, SingletonJobStatus,
};
use crate::backstop::{BackstopCache, SecretKeys, TablePrefix, load_secret};
use crate::clock::Clock;
use crate::decide::{self, JobState, Observed, Waiting};
use crate::lanes::{Lane, Lanes};
use crate::ops::{self, Kind};
use crate::run::Db;
use crate::schedule::Schedule;
use crate::{Error, Result, conditions, kube_io, naming, observe, run};

/// How long in-flight reconciles get to finish their writes once the controller stops.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(250);

/// At most this many reconciles run at once. Their requests to the API server are bounded
/// separately ([`crate::lanes`]: unbounded, a burst of a thousand claims in flight made the Lease
/// renewal miss its deadline); this bound is on memory: a reconcile waiting for a lane holds a few
/// tens of KiB, and at 1,024 the start-up with 10,000 SingletonJobs peaked at 190 MiB resident
/// (against 125 at 128). A run holds its slot from claim to create, not through its confirm
/// ([`run::Confirms`]), so in a burst 128 keep the lanes full.
const MAX_CONCURRENT_RECONCILES: u16 = 128;

/// How long this process remembers a claim it confirmed, to recognise cached copies from before
/// it ([`Context::is_stale`]); a watch that lags longer costs a re-read and a 409, as without it.
const CONFIRMED_TTL: Duration = Duration::from_secs(60);

/// Entries kept in `status.history`.
pub const HISTORY_LIMIT: usize = 20;
const DEFAULT_SUCCESS_LIMIT: i32 = 3;
const DEFAULT_FAILED_LIMIT: i32 = 1;

/// Whether this replica may act, published on a channel (leader election feeds it; a single
/// replica is always allowed). Checked before every write of the run path.
#[derive(Clone)]
pub struct Gate {
    rx: watch::Receiver<GateState>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateState {
    pub may_act: bool,
    /// Leader epoch (the Lease's `leaseTransitions`), 0 without election.
    pub epoch: u64,
    /// The leader's renew deadline (monotonic): past it the gate is closed whatever `may_act`
    /// says, because the election loop may not have run yet (a pause, a busy runtime). None
    /// without election.
    pub valid_until: Option<tokio::time::Instant>,
}

impl Gate {
    pub fn new(rx: watch::Receiver<GateState>) -> Self {
        Gate { rx }
    }

    /// A gate that is always open (single-replica mode).
    pub fn always() -> Self {
        // A receiver keeps the last value after its sender is gone: the state never changes.
        let (_, rx) = watch::channel(GateState {
            may_act: true,
            epoch: 0,
            valid_until: None,
        });
        Gate { rx }
    }

    pub fn check(&self) -> Result<()> {
        let state = *self.rx.borrow();
        if state.may_act
            && state
                .valid_until
                .is_none_or(|v| tokio::time::Instant::now() < v)
        {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    pub fn epoch(&self) -> u64 {
        self.rx.borrow().epoch
    }

    /// Resolves once the gate is closed: at once if it is, else when the state says so or the
    /// renew deadline it carries passes (whichever comes first). Never, for [`Gate::always`].
    pub async fn closed(&self) {
        let mut rx = self.rx.clone();
        loop {
            let state = *rx.borrow_and_update();
            let deadline_passed = state
                .valid_until
                .is_some_and(|v| tokio::time::Instant::now() >= v);
            if !state.may_act || deadline_passed {
                return;
            }
            let deadline = async {
                match state.valid_until {
                    Some(v) => tokio::time::sleep_until(v).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(deadline);
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        // Nobody will change the state again: only the deadline can close it.
                        deadline.await;
                        return;
                    }
                }
                () = &mut deadline => return,
            }
        }
    }

    /// Yields each time the gate opens (this replica starts leading).
    pub fn opened(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        WatchStream::from_changes(self.rx.clone())
            .scan(false, |was_open, s| {
                let opened = s.may_act && !*was_open;
                *was_open = s.may_act;
                futures::future::ready(Some(opened))
            })
            .filter(|opened| futures::future::ready(*opened))
            .map(|_| ())
    }
}

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
    fn send(&self, sj: &SingletonJob, ev: Event) -> impl std::future::Future<Output = ()> + use<> {
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
            "{what} from {} {:?}{}",
            naming::period_rfc3339(e.period.0),
            e.outcome,
            e.reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        );
        self.publish(
            sj,
            type_,
            &format!("Run{:?}", e.outcome),
            "RecordOutcome",
            note,
        )
        .await;
    }
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub events: Events,
    /// Jobs labelled `singleton.dev/job`, kept current by a watch: metadata and status only
    /// (see [`slim_job`]).
    pub jobs: Store<Job>,
    /// Every request of a reconcile to the API server takes a slot here (see [`crate::lanes`]).
    pub lanes: Lanes,
    pub clock: Arc<Clock>,
    pub gate: Gate,
    /// One backstop connection per SingletonJob that has one.
    pub backstops: BackstopCache,
    /// The backstop's refused-stale-write count last seen, per SingletonJob (for Events).
    pub rejections_seen: Mutex<HashMap<String, u64>>,
    /// The highest token whose claim this process confirmed (step 7) and when, per SingletonJob
    /// uid (a re-created SingletonJob has a new uid, and without a backstop its tokens start
    /// again). Only needed until the watch delivers the confirm: entries expire.
    pub confirmed: Mutex<HashMap<String, (u64, tokio::time::Instant)>>,
    /// The confirms (step 7) running in tasks of their own.
    pub confirms: run::Confirms,
    /// Job uids this process resumed lately (step 8): until the Job watch shows them resumed,
    /// the cache still says suspended, and resuming them again would cost a request each.
    pub resumed: Recent,
}

/// Keys seen lately (at most [`Recent::TTL`] ago), bounded by what a minute can bring.
#[derive(Default)]
pub struct Recent(Mutex<HashMap<String, tokio::time::Instant>>);

impl Recent {
    const TTL: Duration = Duration::from_secs(30);

    pub fn note(&self, key: &str) {
        let now = tokio::time::Instant::now();
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if m.len() >= 1024 {
            m.retain(|_, at| now.duration_since(*at) < Self::TTL);
        }
        m.insert(key.to_string(), now);
    }

    pub fn contains(&self, key: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .is_some_and(|at| at.elapsed() < Self::TTL)
    }
}

impl Context {
    /// Records that this process confirmed the claim with `token` (it is no longer pending).
    pub fn confirmed(&self, sj: &SingletonJob, token: u64) {
        if let Some(uid) = sj.metadata.uid.clone() {
            let now = tokio::time::Instant::now();
            let mut m = self
                .confirmed
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // Bounded by the claims of the last minute, whatever the churn of SingletonJobs.
            if m.len() >= 1024 {
                m.retain(|_, (_, at)| now.duration_since(*at) < CONFIRMED_TTL);
            }
            let e = m.entry(uid).or_insert((token, now));
            *e = (e.0.max(token), now);
        }
    }

    /// Whether `sj` (with `status`) is older than a claim this process confirmed. Tokens only
    /// increase and the confirmed status carries its token, so a copy whose token is lower, or
    /// whose pending claim has that token or a lower one, was read before the confirm.
    ///
    /// The first copy that is not older (the watch delivered the confirm, or something newer)
    /// ends the memory: the cache never goes back, so no older copy can come any more, and a
    /// status that later shows a lower token was wiped or restored, which must be seen (it is
    /// raised to the Jobs, [`crate::observe::behind`]), not skipped as a stale copy.
    pub fn is_stale(&self, sj: &SingletonJob, status: &SingletonJobStatus) -> bool {
        let Some(uid) = sj.metadata.uid.as_ref() else {
            return false;
        };
        let mut confirmed = self
            .confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(&(t, at)) = confirmed.get(uid) else {
            return false;
        };
        let stale = at.elapsed() < CONFIRMED_TTL
            && (status.fencing_token < t
                || status.pending_claim.as_ref().is_some_and(|c| c.token <= t));
        if !stale {
            confirmed.remove(uid);
        }
        stale
    }

    fn forget_confirmed(&self, sj: &SingletonJob) {
        if let Some(uid) = &sj.metadata.uid {
            self.confirmed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(uid);
        }
    }
}

/// The state of a Job as the decision core sees it.
fn job_state(job: &Job) -> JobState {
    let status = job.status.as_ref();
    let conds = status.and_then(|s| s.conditions.as_ref());
    let done = |types: &[&str]| {
        conds.and_then(|cs| {
            cs.iter()
                .find(|c| types.contains(&c.type_.as_str()) && c.status == "True")
                .map(|c| {
                    c.last_transition_time
                        .as_ref()
                        .map(|t| t.0)
                        .unwrap_or_else(Timestamp::now)
                })
        })
    };
    if let Some(at) = done(&["Complete"]) {
        JobState::Succeeded(
            status
                .and_then(|s| s.completion_time.as_ref())
                .map(|t| t.0)
                .unwrap_or(at),
        )
    } else if let Some(at) = done(&["Failed"]) {
        JobState::Failed(at)
    } else {
        JobState::Active
    }
}

/// The state of each active run's Job: from the cache, or from the API server when the cache does
/// not have it (it may lag behind a Job we just created, and "gone" must be a fact, not a guess).
async fn active_job_states(
    ctx: &Context,
    sj: &SingletonJob,
    active: &[RunRef],
) -> Result<HashMap<String, JobState>> {
    let ns = sj.namespace().unwrap_or_default();
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let mut out = HashMap::new();
    for run in active {
        let cached = ctx.jobs.get(&ObjectRef::new(&run.job_name).within(&ns));
        let state = match cached {
            Some(job) => job_state(&job),
            None => match api.get_opt(&run.job_name).await? {
                Some(job) => job_state(&job),
                None => JobState::Gone,
            },
        };
        out.insert(run.job_name.clone(), state);
    }
    Ok(out)
}

pub async fn reconcile(sj: Arc<SingletonJob>, ctx: Arc<Context>) -> Result<Action> {
    if sj.metadata.deletion_timestamp.is_some() {
        // Owner references garbage-collect the Jobs.
        crate::metrics::global().forget(&sj);
        ctx.forget_confirmed(&sj);
        return Ok(Action::await_change());
    }
    // A standby keeps its caches warm but decides nothing: everything is reconciled when the
    // gate opens.
    if ctx.gate.check().is_err() {
        return Ok(Action::await_change());
    }
    let _timer = crate::metrics::global().reconcile_timer();
    // A verdict on the clocks no older than --clock-check-seconds (G4); at rest none is sought.
    let clock = ctx.clock.fresh().await;
    // A period is due when both clocks say it has come: decide by the earliest time the API
    // server's clock may show (within the tolerated bound), so no Job is ever stamped by the API
    // server before its scheduled instant (G4).
    let now = clock.due_now(Timestamp::now());
    let generation = sj.metadata.generation;
    let mut status = sj.status.clone().unwrap_or_default();

    // This SingletonJob's run is being confirmed (step 7, in a task of its own): the status read
    // here is about to change; the confirm asks for a reconcile when it is done.
    if ctx.confirms.in_flight(&sj) {
        return Ok(Action::await_change());
    }

    // A cached copy from before this process confirmed its own claim (a Job event can trigger a
    // reconcile before the watch delivers our confirm, which triggers one of its own): acting on
    // it would claim or complete again from an old resourceVersion, costing a request and a 409.
    if ctx.is_stale(&sj, &status) {
        return Ok(Action::await_change());
    }

    // The large steps below (backstop, run protocol, pruning) are boxed: a reconcile's future is
    // sized for its largest step, and in a burst a hundred of them wait in the lanes at once
    // (14 KiB each instead of 28).
    let db = Box::pin(resolve_backstop(&ctx, &sj)).await;
    if let Db::Ready(b) = &db
        && let Some(total) = Box::pin(crate::metrics::global().sample_rejections(&sj, b)).await
    {
        // The first sample after start-up is the baseline; a rise since is news for a human.
        let before = ctx
            .rejections_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(sj.key(), total);
        if let Some(before) = before
            && total > before
        {
            let note = format!(
                "the backstop refused {} write(s) carrying a stale fencing token ({total} in all): a paused or replaced run tried to write",
                total - before
            );
            ctx.events
                .publish(
                    &sj,
                    EventType::Warning,
                    "StaleTokenRefused",
                    "ObserveFence",
                    note,
                )
                .await;
        }
    }

    // A broken lock goes before anything else, a half-done claim included: it is asked for
    // because a holder is stuck, and it clears that claim.
    if let Some(req) = ops::pending(&sj, Kind::BreakLock) {
        return break_lock(&ctx, &sj, req, &db).await;
    }

    // A claim left half-done by a replica that died: finish it first, with its name and token.
    if let Some(claim) = status.pending_claim.clone() {
        let span = run::span(&sj, &claim);
        tracing::Instrument::instrument(
            Box::pin(run::complete_claim(
                &ctx,
                &sj,
                claim,
                &db,
                run::Read::Earlier,
            )),
            span,
        )
        .await?;
        // Its confirm asks for the next reconcile when done; a period decided without a Job
        // comes back through the watch of that status write.
        return Ok(Action::await_change());
    }

    // The SingletonJob's own Jobs, held against its status (G1).
    let owned = observe::owned(&sj, ctx.jobs.state().iter().map(|j| j.as_ref()));
    if let Some(behind) = observe::behind(&status, &owned) {
        return Box::pin(raise_to_jobs(&ctx, &sj, behind, now)).await;
    }
    Box::pin(check_jobs(&ctx, &sj, &status, &owned)).await?;

    status.observed_generation = generation;
    let schedule = match Schedule::parse(
        &sj.spec.schedule,
        sj.spec.time_zone.as_deref(),
        sj.spec.dst_policy,
    ) {
        Ok(s) => s,
        Err(err) => {
            let msg = err.to_string();
            let mut changed = conditions::set(
                &mut status.conditions,
                conditions::SCHEDULE_VALID,
                false,
                "InvalidSchedule",
                &msg,
                generation,
                now,
            );
            changed |= conditions::set(
                &mut status.conditions,
                conditions::READY,
                false,
                "InvalidSchedule",
                &msg,
                generation,
                now,
            );
            status.next_schedule_time = None;
            status.next_schedule_times.clear();
            crate::metrics::global().next_run(&sj, None);
            if changed || sj.status.as_ref().map(|s| s.observed_generation) != Some(generation) {
                run::write_status(&ctx, &sj, status, Lane::Background).await?;
                ctx.events
                    .publish(
                        &sj,
                        EventType::Warning,
                        "InvalidSchedule",
                        "ParseSchedule",
                        msg,
                    )
                    .await;
            }
            // Nothing will change until the spec does.
            return Ok(Action::await_change());
        }
    };

    // The API server itself judges the Job template, once per spec generation (a dry-run create),
    // so a template it would reject is reported before any period is claimed for it.
    let template = match conditions::for_generation(
        &status.conditions,
        conditions::JOB_TEMPLATE_VALID,
        generation,
    ) {
        Some(c) => (c.status == "True")
            .then_some(())
            .ok_or_else(|| c.message.clone()),
        None => Box::pin(run::dry_run_job(&ctx, &sj, now)).await?,
    };
    match &template {
        Ok(()) => conditions::set(
            &mut status.conditions,
            conditions::JOB_TEMPLATE_VALID,
            true,
            "Accepted",
            "the API server accepts the Job template (dry run)",
            generation,
            now,
        ),
        Err(msg) => {
            let changed = conditions::set(
                &mut status.conditions,
                conditions::JOB_TEMPLATE_VALID,
                false,
                "Rejected",
                msg.clone(),
                generation,
                now,
            );
            if changed {
                ctx.events
                    .publish(
                        &sj,
                        EventType::Warning,
                        "JobTemplateRejected",
                        "ValidateTemplate",
                        msg.clone(),
                    )
                    .await;
            }
            changed
        }
    };

    let states = Box::pin(active_job_states(&ctx, &sj, &status.active)).await?;
    let correctness =
        sj.spec.lock.as_ref().map(|l| l.purpose).unwrap_or_default() == LockPurpose::Correctness;
    let blocked = if !clock.trusted {
        Some(Waiting::ClockUntrusted)
    } else if template.is_err() {
        Some(Waiting::JobTemplateInvalid)
    } else if matches!(db, Db::Unavailable(_)) && correctness {
        Some(Waiting::BackstopUnavailable)
    } else {
        None
    };
    let created = sj
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(now);
    let obs = Observed {
        now,
        created,
        blocked,
        job_states: &states,
    };
    let plan = decide::plan(
        &sj.spec,
        &schedule,
        status.decided_through.as_ref().map(|t| t.0),
        status.schedule_fingerprint.as_deref(),
        &status.active,
        &obs,
    );

    // A finished run's period is decided: its token is retired in the backstop first (G3), so
    // that no copy of it can pass the fence from now on.
    if let Db::Ready(b) = &db
        && let Some(token) = plan.finished.iter().map(|(r, _, _)| r.token).max()
    {
        Box::pin(run::retire(&sj, b, token)).await?;
    }

    // Record what the plan decided.
    let mut new_entries: Vec<HistoryEntry> = Vec::new();
    for (run, outcome, at) in &plan.finished {
        if *outcome == Outcome::Succeeded {
            status.last_successful_time = Some((*at).into());
        }
        // Keep what the run's entry already said (such as BackstopSkipped) unless the Job vanished.
        let earlier = status
            .history
            .iter()
            .find(|h| h.job_name.as_deref() == Some(&run.job_name))
            .and_then(|h| h.reason.clone());
        let reason = matches!(states.get(&run.job_name), Some(JobState::Gone))
            .then(|| decide::reason::JOB_DELETED.to_string())
            .or(earlier);
        // The run's "Running" entry becomes its outcome.
        status
            .history
            .retain(|h| h.job_name.as_deref() != Some(&run.job_name));
        new_entries.push(HistoryEntry {
            period: run.period.clone(),
            last_period: None,
            count: 1,
            outcome: *outcome,
            reason,
            job_name: Some(run.job_name.clone()),
            token: Some(run.token),
            start_time: run.claimed_at.clone(),
            finish_time: Some((*at).into()),
        });
    }
    new_entries.extend(plan.records.iter().cloned());
    for e in &new_entries {
        status.history.insert(0, e.clone());
        status.last_result = Some(e.outcome);
    }
    status.history.truncate(HISTORY_LIMIT);
    status.active = plan.still_active.clone();
    status.active_count = status.active.len() as i32;
    status.decided_through = plan.decided_through.map(Into::into);
    status.schedule_fingerprint = Some(plan.fingerprint.clone());
    let next: Vec<Timestamp> = schedule.iter_after(now).take(3).collect();
    status.next_schedule_time = next.first().map(|t| naming::period_rfc3339(*t));
    status.next_schedule_times = next.iter().map(|t| (*t).into()).collect();
    crate::metrics::global().next_run(&sj, next.first().copied());

    // Conditions.
    let suspended = sj.spec.suspend.unwrap_or(false);
    let conds = &mut status.conditions;
    conditions::set(
        conds,
        conditions::SCHEDULE_VALID,
        true,
        "Parsed",
        format!(
            "{} in {}",
            schedule.expr(),
            sj.spec.time_zone.as_deref().unwrap_or("UTC")
        ),
        generation,
        now,
    );
    conditions::set(
        conds,
        conditions::SUSPENDED,
        suspended,
        if suspended { "Suspended" } else { "Active" },
        "",
        generation,
        now,
    );
    // The exact offset changes with every measurement; only a verdict change is worth a write.
    let clock_msg = match (clock.trusted, clock.offset) {
        (true, _) => "the local clock agrees with the API server's".to_string(),
        (false, Some(o)) => format!(
            "API server clock minus local clock: {} s; no run starts until they agree",
            o.as_secs()
        ),
        (false, None) => {
            "the API server's clock has not been measured yet; no run starts until it is"
                .to_string()
        }
    };
    conditions::set(
        conds,
        conditions::CLOCK_TRUSTED,
        clock.trusted,
        if clock.trusted { "InSync" } else { "ClockSkew" },
        clock_msg,
        generation,
        now,
    );
    match &db {
        Db::NotConfigured => conds.retain(|c| c.type_ != conditions::BACKSTOP_READY),
        Db::Ready(_) => {
            conditions::set(
                conds,
                conditions::BACKSTOP_READY,
                true,
                "Connected",
                "the backstop database answers and its schema is in place",
                generation,
                now,
            );
        }
        Db::Unavailable(why) => {
            if conditions::set(
                conds,
                conditions::BACKSTOP_READY,
                false,
                "Unavailable",
                why.clone(),
                generation,
                now,
            ) {
                ctx.events
                    .publish(
                        &sj,
                        EventType::Warning,
                        "BackstopUnavailable",
                        "ConnectBackstop",
                        why.clone(),
                    )
                    .await;
            }
        }
    }
    let (ready, why) = match plan.waiting.or(blocked) {
        Some(Waiting::ClockUntrusted) => (false, "ClockSkew"),
        Some(Waiting::JobTemplateInvalid) => (false, "JobTemplateRejected"),
        Some(Waiting::BackstopUnavailable) => (false, "BackstopUnavailable"),
        _ => (true, "Scheduled"),
    };
    conditions::set(conds, conditions::READY, ready, why, "", generation, now);
    settle_consistency(&mut status, generation, now);
    if let Db::Ready(b) = &db {
        mark_claims_recorded(&mut status, b.target_id(), created, now);
    } else if matches!(db, Db::NotConfigured) {
        status.claims_recorded = None;
    }

    // Operations users asked for (trigger, backfill) come after the schedule's own run.
    let mut notes = Vec::new();
    let manual = match plan.start {
        Some(_) => None,
        None => {
            let gates = ManualGates {
                blocked,
                template: &template,
                active: &plan.still_active,
                owned: &owned,
            };
            next_operation(
                &sj,
                &mut status,
                &schedule,
                &plan,
                &gates,
                &db,
                now,
                &mut notes,
            )
            .await?
        }
    };

    // Who asked for the manual run, for its Event; whether an operation goes on after this.
    let requested_by = manual.and_then(|(_, origin)| {
        Kind::from(origin)
            .slot(&status.operations)
            .and_then(|o| o.requested_by.clone())
    });
    let ops_going_on = ops::in_progress(&status.operations);

    // Act.
    let mut started_manual = None;
    if let Some(period) = plan.start {
        let why = run::Why::Scheduled {
            replace: &plan.replace,
        };
        Box::pin(run::start(&ctx, &sj, status, period, why, &db)).await?;
    } else if let Some((period, origin)) = manual {
        let claim = Box::pin(run::start(
            &ctx,
            &sj,
            status,
            period,
            run::Why::Manual(origin),
            &db,
        ))
        .await?;
        started_manual = Some((origin, claim));
    } else if sj.status.as_ref() != Some(&status) {
        run::write_status(&ctx, &sj, status.clone(), Lane::Background).await?;
    }
    for e in &new_entries {
        ctx.events.recorded(&sj, e).await;
        crate::metrics::global().recorded(&sj, e);
    }
    for (type_, reason, note) in notes {
        ctx.events
            .publish(&sj, type_, reason, "Operate", note)
            .await;
    }
    if let Some((origin, claim)) = &started_manual {
        let by = requested_by.as_deref().unwrap_or("unknown");
        let note = format!(
            "{} requested by {by}: Job {} for period {} with fencing token {}",
            Kind::from(*origin).command(),
            claim.job_name,
            naming::period_rfc3339(claim.period.0),
            claim.token
        );
        let reason = match origin {
            RunOrigin::Trigger => "RunTriggered",
            RunOrigin::Backfill => "BackfillRunStarted",
        };
        ctx.events
            .publish(&sj, EventType::Normal, reason, "Operate", note)
            .await;
    }

    Box::pin(prune_jobs(&ctx, &sj)).await?;

    // A manual run just started: look again at once (a backfill goes on, or waits for it).
    // An operation waiting on the clock or the backstop is looked at again shortly; one waiting
    // for a run to finish is woken by that Job's change as well.
    if let Some(at) = plan.wake_at {
        ctx.clock.prepare(at);
    }
    let wake = plan.wake_at.map(|at| until(now, at));
    let operating = if started_manual.is_some() {
        Some(Duration::ZERO)
    } else {
        ops_going_on.then_some(OPERATION_RETRY)
    };
    Ok(match (wake, operating) {
        (Some(a), Some(b)) => Action::requeue(a.min(b)),
        (a, b) => a.or(b).map_or_else(Action::await_change, Action::requeue),
    })
}

/// The status is behind the SingletonJob's own Jobs (wiped by hand, or an etcd restore): acting
/// on it would run again the periods those Jobs ran, with their tokens. Instead the token and the
/// cursor are raised to the bounds the Jobs' labels give, the Jobs still running are adopted as
/// active, and a `StatusConsistent=False` condition and a Warning Event say what happened. This
/// reconcile does nothing else; the next one goes on from the raised status.
async fn raise_to_jobs(
    ctx: &Context,
    sj: &SingletonJob,
    behind: observe::Behind,
    now: Timestamp,
) -> Result<Action> {
    let mut status = sj.status.clone().unwrap_or_default();
    let mut raised = Vec::new();
    if let Some(token) = behind.token {
        raised.push(format!(
            "fencingToken from {} to {token}",
            status.fencing_token
        ));
        status.fencing_token = token;
    }
    if let Some(through) = behind.decided_through {
        let was = status
            .decided_through
            .as_ref()
            .map_or("unset".to_string(), |t| naming::period_rfc3339(t.0));
        raised.push(format!(
            "decidedThrough from {was} to {}",
            naming::period_rfc3339(through)
        ));
        status.decided_through = Some(through.into());
        if status
            .last_schedule_time
            .as_ref()
            .is_none_or(|t| t.0 < through)
        {
            status.last_schedule_time = Some(through.into());
        }
        // A wiped status lost the fingerprint its cursor refers to: it is the current schedule's,
        // else the cursor would be taken for an edit's and jump to now.
        if status.schedule_fingerprint.is_none() {
            status.schedule_fingerprint = Some(decide::fingerprint(&sj.spec));
        }
    }
    for run in &behind.running {
        raised.push(format!(
            "adopted running Job {} (token {})",
            run.job_name, run.token
        ));
    }
    status.active.extend(behind.running);
    status.active_count = status.active.len() as i32;
    let message = format!(
        "status was behind this SingletonJob's Jobs (wiped or restored from an older copy); raised {}; no period they ran is run again",
        raised.join(", ")
    );
    conditions::set(
        &mut status.conditions,
        conditions::STATUS_CONSISTENT,
        false,
        "StatusBehind",
        message.clone(),
        sj.metadata.generation,
        now,
    );
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

/// The last line of defence and the completion of a lost resume (see [`observe`]): Jobs of
/// decided periods that no claim knows are removed by uid, with an Event; confirmed runs whose
/// Job is still suspended are resumed.
async fn check_jobs(
    ctx: &Context,
    sj: &SingletonJob,
    status: &SingletonJobStatus,
    owned: &[observe::OwnedJob],
) -> Result<()> {
    let ns = sj.namespace().unwrap_or_default();
    for job in observe::unknown(status, owned) {
        let bg = kube_io::Propagation::Background;
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

/// After [`raise_to_jobs`], `StatusConsistent` stays False until a run claimed after the raise
/// is in the history: from then on the status again records what it started itself.
fn settle_consistency(status: &mut SingletonJobStatus, generation: Option<i64>, now: Timestamp) {
    let Some(raised_at) = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::STATUS_CONSISTENT && c.status == "False")
        .map(|c| c.last_transition_time.0)
    else {
        return;
    };
    let since_raise = status
        .history
        .iter()
        .any(|h| h.job_name.is_some() && h.start_time.as_ref().is_some_and(|t| t.0 >= raised_at));
    if since_raise {
        conditions::set(
            &mut status.conditions,
            conditions::STATUS_CONSISTENT,
            true,
            "Consistent",
            "runs started since the status was raised are recorded in it",
            generation,
            now,
        );
    }
}

/// Keeps `status.claimsRecorded` true: from when the backstop `target` has recorded every run.
/// A SingletonJob that never issued a token has had it from its creation; otherwise from now
/// (the backstop was added or moved, or a run went without its claim).
fn mark_claims_recorded(
    status: &mut SingletonJobStatus,
    target: String,
    created: Timestamp,
    now: Timestamp,
) {
    if status
        .claims_recorded
        .as_ref()
        .is_some_and(|c| c.target == target)
    {
        return;
    }
    let fresh = status.fencing_token == 0 && status.history.is_empty();
    // Status keeps whole seconds: rounded up, so a period that ran without a claim in the same
    // second is never after `since`.
    let since = if fresh {
        created
    } else {
        Timestamp::from_second(now.as_second() + i64::from(now.subsec_nanosecond() > 0))
            .unwrap_or(now)
    };
    status.claims_recorded = Some(Box::new(ClaimsRecorded {
        since: since.into(),
        target,
    }));
}

/// How soon an operation that waits (clock, backstop, a running Job) is looked at again.
const OPERATION_RETRY: Duration = Duration::from_secs(2);

/// What stands in the way of a manual run.
struct ManualGates<'a> {
    blocked: Option<Waiting>,
    template: &'a std::result::Result<(), String>,
    /// Runs still active after this reconcile's plan.
    active: &'a [RunRef],
    /// The SingletonJob's own Jobs.
    owned: &'a [observe::OwnedJob],
}

impl ManualGates<'_> {
    /// Why a manual run cannot start now, if so. Manual runs never replace a run and never
    /// overlap one unless concurrencyPolicy is Allow.
    fn waiting(&self, sj: &SingletonJob) -> Option<String> {
        match self.blocked {
            Some(Waiting::ClockUntrusted) => {
                return Some("waiting for the local clock to agree with the API server's".into());
            }
            Some(Waiting::BackstopUnavailable) => {
                return Some("waiting for the backstop database to answer".into());
            }
            _ => {}
        }
        if !self.active.is_empty() && sj.spec.concurrency_policy != ConcurrencyPolicy::Allow {
            let names: Vec<&str> = self.active.iter().map(|r| r.job_name.as_str()).collect();
            return Some(format!(
                "waiting for the active run {} to finish (a manual run never overlaps or replaces one unless concurrencyPolicy is Allow)",
                names.join(", ")
            ));
        }
        None
    }
}

/// The next step of a trigger or backfill: records acceptance, rejection and progress in
/// `status.operations` and, when a run is to start now, returns its period (to be claimed through
/// [`run::start`], whose claim write also marks the step done). Events to publish after the write
/// go to `notes`.
#[allow(clippy::too_many_arguments)]
async fn next_operation(
    sj: &SingletonJob,
    status: &mut crate::api::SingletonJobStatus,
    schedule: &Schedule,
    plan: &decide::Plan,
    gates: &ManualGates<'_>,
    db: &Db,
    now: Timestamp,
    notes: &mut Vec<(EventType, &'static str, String)>,
) -> Result<Option<(Timestamp, RunOrigin)>> {
    let reject = |status: &mut crate::api::SingletonJobStatus,
                  kind: Kind,
                  id: &str,
                  req: Option<&ops::Request>,
                  message: String,
                  notes: &mut Vec<(EventType, &'static str, String)>| {
        notes.push((
            EventType::Warning,
            "OperationRejected",
            format!("{} {id} rejected: {message}", kind.command()),
        ));
        *kind.slot_mut(&mut status.operations) = Some(ops::rejected(id, req, message, now));
    };

    // Trigger: one run now, as a manual period with its own token.
    if let Some(req) = ops::pending(sj, Kind::Trigger) {
        match req {
            Err(bad) => reject(status, Kind::Trigger, &bad.id, None, bad.message, notes),
            Ok(req) => {
                if let Err(msg) = gates.template {
                    let why = format!("the API server rejects the Job template: {msg}");
                    reject(status, Kind::Trigger, &req.id, Some(&req), why, notes);
                } else if let Some(why) = gates.waiting(sj) {
                    let mut op = ops::accepted(&req, now);
                    op.message = why;
                    ops::set(&mut status.operations.trigger, op);
                } else {
                    status.operations.trigger = Some(ops::accepted(&req, now));
                    return Ok(Some((naming::manual_period(now), RunOrigin::Trigger)));
                }
            }
        }
    }

    // Backfill: a new request is checked and its range fixed once...
    if let Some(req) = ops::pending(sj, Kind::Backfill) {
        let req = match req {
            Err(bad) => {
                reject(status, Kind::Backfill, &bad.id, None, bad.message, notes);
                return Ok(None);
            }
            Ok(req) => req,
        };
        let decided = plan.decided_through.unwrap_or(now);
        let range = match (db, gates.template, req.from.zip(req.to)) {
            (Db::NotConfigured, _, _) => Err(
                "backfill needs spec.backstop: only the backstop's claims table remembers every period that ever ran, so without it a backfill could run a period twice"
                    .to_string(),
            ),
            (_, Err(msg), _) => Err(format!("the API server rejects the Job template: {msg}")),
            (_, _, Some((from, to))) => ops::backfill_range(schedule, from, to, decided)
                .and_then(|r| {
                    let created = sj.metadata.creation_timestamp.as_ref().map(|t| t.0);
                    ops::check_claims_recorded(r, created, status.claims_recorded.as_deref())
                }),
            (_, _, None) => Err("backfill needs from and to".into()),
        };
        match range {
            Err(why) => {
                reject(status, Kind::Backfill, &req.id, Some(&req), why, notes);
                return Ok(None);
            }
            Ok((first, last, count)) => {
                let mut op = ops::accepted(&req, now);
                op.phase = OperationPhase::Running;
                op.from = Some(first.into());
                op.to = Some(last.into());
                op.next = Some(first.into());
                op.message = format!(
                    "backfilling {count} period(s) from {} to {}",
                    naming::period_rfc3339(first),
                    naming::period_rfc3339(last)
                );
                notes.push((
                    EventType::Normal,
                    "BackfillAccepted",
                    format!(
                        "backfill requested by {}: {}",
                        req.by.as_deref().unwrap_or("unknown"),
                        op.message
                    ),
                ));
                status.operations.backfill = Some(op);
            }
        }
    }

    // ...then walked a period at a time: one that ran before (its claim is in the backstop) is
    // counted and passed; the first that did not is started, once it may.
    let Some(mut op) = status
        .operations
        .backfill
        .clone()
        .filter(|o| matches!(o.phase, OperationPhase::Pending | OperationPhase::Running))
    else {
        return Ok(None);
    };
    let backstop = match db {
        Db::Ready(b) => b.clone(),
        Db::Unavailable(why) => {
            op.message = format!("waiting for the backstop database: {why}");
            ops::set(&mut status.operations.backfill, op);
            return Ok(None);
        }
        Db::NotConfigured => {
            let why = "spec.backstop was removed while the backfill ran".to_string();
            let id = op.id.clone();
            reject(status, Kind::Backfill, &id, None, why, notes);
            return Ok(None);
        }
    };
    // Bounded, so a long run of periods that ran before spreads over several reconciles.
    for _ in 0..BACKFILL_CHECKS_PER_RECONCILE {
        let Some(period) = ops::backfill_next(schedule, &op) else {
            op.phase = OperationPhase::Done;
            op.message = format!(
                "started {} run(s); {} period(s) had run before",
                op.started, op.already_run
            );
            let note = format!("backfill {} done: {}", op.id, op.message);
            notes.push((EventType::Normal, "BackfillDone", note));
            ops::set(&mut status.operations.backfill, op);
            return Ok(None);
        };
        // Any record that the period ran counts: the backstop's claim, the status history, a
        // Job of the period.
        if observe::ran(status, gates.owned, period)
            || backstop.claimed(&sj.key(), period).await?.is_some()
        {
            op.already_run += 1;
            op.next = Some(ops::after(period).into());
            continue;
        }
        if let Some(why) = gates.waiting(sj) {
            op.message = why;
            ops::set(&mut status.operations.backfill, op);
            return Ok(None);
        }
        ops::set(&mut status.operations.backfill, op);
        return Ok(Some((period, RunOrigin::Backfill)));
    }
    ops::set(&mut status.operations.backfill, op);
    Ok(None)
}

/// Periods a backfill checks against the backstop in one reconcile.
const BACKFILL_CHECKS_PER_RECONCILE: usize = 200;

/// Handles a break-lock request (see [`run::break_lock`]).
async fn break_lock(
    ctx: &Context,
    sj: &SingletonJob,
    req: std::result::Result<ops::Request, ops::Invalid>,
    db: &Db,
) -> Result<Action> {
    let now = Timestamp::now();
    let req = match req {
        Ok(req) => req,
        Err(bad) => {
            let mut status = sj.status.clone().unwrap_or_default();
            status.operations.break_lock =
                Some(ops::rejected(&bad.id, None, bad.message.clone(), now));
            run::write_status(ctx, sj, status, Lane::Background).await?;
            let note = format!("break-lock {} rejected: {}", bad.id, bad.message);
            ctx.events
                .publish(sj, EventType::Warning, "OperationRejected", "Operate", note)
                .await;
            return Ok(Action::requeue(Duration::ZERO));
        }
    };
    match Box::pin(run::break_lock(ctx, sj, ops::accepted(&req, now), db)).await {
        Ok(done) => {
            let note = format!(
                "lock broken by {}: {}; {}",
                req.by.as_deref().unwrap_or("unknown"),
                req.reason.as_deref().unwrap_or_default(),
                done.message
            );
            ctx.events
                .publish(sj, EventType::Warning, "LockBroken", "BreakLock", note)
                .await;
            Ok(Action::requeue(Duration::ZERO))
        }
        Err(Error::BackstopUnavailable(why)) => {
            // Say so where the requester looks, and try again.
            let mut status = sj.status.clone().unwrap_or_default();
            let mut op = ops::accepted(&req, now);
            op.message = format!("waiting for the backstop database to raise the fence: {why}");
            if ops::set(&mut status.operations.break_lock, op) {
                run::write_status(ctx, sj, status, Lane::Background).await?;
            }
            Ok(Action::requeue(OPERATION_RETRY))
        }
        Err(e) => Err(e),
    }
}

/// The SingletonJob's backstop, connected and checked (the schema is ensured on connect). Every
/// failure becomes a reason that names no secret value.
async fn resolve_backstop(ctx: &Context, sj: &SingletonJob) -> Db {
    let Some(pg) = sj.spec.backstop.as_ref().and_then(|b| b.postgres.as_ref()) else {
        ctx.backstops.forget(&sj.key());
        return Db::NotConfigured;
    };
    let ns = sj.namespace().unwrap_or_default();
    let data = match load_secret(&ctx.client, &ns, &pg.secret_ref.name).await {
        Ok(d) => d,
        Err(e) => return Db::Unavailable(e.to_string()),
    };
    let prefix = match pg.table_prefix.as_deref().map(TablePrefix::new).transpose() {
        Ok(p) => p.unwrap_or_default(),
        Err(e) => return Db::Unavailable(e.to_string()),
    };
    let db = match ctx
        .backstops
        .get(&sj.key(), &data, &SecretKeys::default(), &prefix)
    {
        Ok(db) => db,
        Err(e) => return Db::Unavailable(e.to_string()),
    };
    match db.ping().await {
        Ok(()) => Db::Ready(db),
        Err(e) => Db::Unavailable(e.to_string()),
    }
}

/// Time from `now` until `at`, rounded up to the millisecond so a timer never fires before `at`.
fn until(now: Timestamp, at: Timestamp) -> Duration {
    let d = at.duration_since(now);
    if d <= SignedDuration::ZERO {
        return Duration::ZERO;
    }
    let ms = d.as_millis() as u64 + u64::from(d.subsec_nanos() % 1_000_000 != 0);
    Duration::from_millis(ms)
}

/// Deletes finished Jobs beyond the history limits, oldest first. Only Jobs whose outcome is
/// already recorded (not active, not a pending claim) are candidates.
async fn prune_jobs(ctx: &Context, sj: &SingletonJob) -> Result<()> {
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
        if !owned || busy {
            continue;
        }
        let Some(job_uid) = job.metadata.uid.clone() else {
            continue;
        };
        match job_state(&job) {
            JobState::Succeeded(at) => ok.push((at, name, job_uid)),
            JobState::Failed(at) => failed.push((at, name, job_uid)),
            _ => {}
        }
    }
    let bg = kube_io::Propagation::Background;
    for (list, keep) in [(&mut ok, keep_ok), (&mut failed, keep_failed)] {
        list.sort();
        let excess = list.len().saturating_sub(keep);
        for (_, name, job_uid) in list.drain(..excess) {
            kube_io::delete_job_uid(ctx, &ns, &name, &job_uid, bg, Lane::Background).await?;
        }
    }
    Ok(())
}

fn error_policy(sj: Arc<SingletonJob>, err: &Error, _ctx: Arc<Context>) -> Action {
    crate::metrics::global().reconcile_error(err);
    match err {
        // Someone else wrote first: re-read (the watch brings the new object) and decide again.
        Error::Conflict(_) => Action::requeue(Duration::from_millis(50)),
        Error::NotLeader => Action::await_change(),
        // A run's transaction holds the fence row; under Replace that run is being stopped.
        Error::FenceHeld(why) => {
            tracing::info!(sj = %sj.key(), %why, "waiting for the backstop's fence row");
            Action::requeue(Duration::from_secs(1))
        }
        _ => {
            tracing::warn!(sj = %sj.key(), kind = err.kind(), error = %err, "reconcile failed");
            Action::requeue(Duration::from_secs(5))
        }
    }
}

/// What the cache keeps of a Job: its metadata (name, labels, annotations, owner), status and
/// `spec.suspend`, which is all the controller reads from a cached Job. Managed fields and the
/// pod template are most of a Job's size, and a cache of thousands of Jobs held them all.
fn slim_job(job: &mut Job) {
    job.metadata.managed_fields = None;
    // Of the spec, only whether it may run pods (see run.rs, step 8).
    let suspend = job.spec.as_ref().and_then(|s| s.suspend);
    job.spec = suspend.map(|suspend| k8s_openapi::api::batch::v1::JobSpec {
        suspend: Some(suspend),
        ..Default::default()
    });
}

/// What the cache keeps of a SingletonJob: all but its managed fields and kubectl's copy of the
/// last applied spec. Safe to drop: the controller writes a SingletonJob only through the status
/// subresource, where the API server ignores every change outside `status`.
pub(crate) fn slim_sj(sj: &mut SingletonJob) {
    sj.metadata.managed_fields = None;
    if let Some(a) = sj.metadata.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Configuration of a controller instance.
#[derive(Clone, Debug)]
pub struct Config {
    /// Watch only this namespace (all when None).
    pub namespace: Option<String>,
    /// Reporting controller name in Events.
    pub reporter: String,
    /// Instance name (pod name) in Events.
    pub instance: Option<String>,
    /// Clock verdicts, fed by the client's responses ([`crate::clock::Samples::client`]).
    pub clock: crate::clock::Samples,
    /// How old a clock verdict may be when a run may start.
    pub clock_check_interval: Duration,
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    cfg: Config,
    gate: Gate,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let (sjs, jobs_api): (Api<SingletonJob>, Api<Job>) = match &cfg.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    // Fail fast with a clear message if the CRD is not installed.
    sjs.list(&ListParams::default().limit(1)).await.map_err(|e| Error::Config(format!("cannot list SingletonJobs (is the CRD installed? try `kubectl apply -f crds/`): {e}")))?;

    let clock = Arc::new(Clock::new(
        cfg.clock.clone(),
        client.clone(),
        cfg.clock_check_interval,
    ));
    // A first verdict before anything is reconciled.
    clock.fresh().await;
    let clock_rx = clock.subscribe();

    let (reader, writer) = reflector::store::<Job>();
    let job_watch = watcher::Config::default().labels(naming::LABEL_JOB);
    let job_stream = reflector::reflector(writer, watcher(jobs_api, job_watch).modify(slim_job))
        .default_backoff()
        .touched_objects();
    let (sj_reader, sj_writer) = reflector::store::<SingletonJob>();
    let sj_stream = reflector::reflector(
        sj_writer,
        watcher(sjs, watcher::Config::default()).modify(slim_sj),
    )
    .applied_objects();

    let reporter = Reporter {
        controller: cfg.reporter.clone(),
        instance: cfg.instance.clone(),
    };
    let gate_opened = gate.opened();
    let lanes = Lanes::new(crate::lanes::IN_FLIGHT);
    let (confirms, confirmed_runs) = run::Confirms::new();
    crate::memory::limit_arenas();
    tokio::spawn(crate::memory::give_back_after_bursts(lanes.clone()));
    let ctx = Arc::new(Context {
        client: client.clone(),
        events: Events::new(client.clone(), reporter, lanes.clone()),
        lanes,
        jobs: reader,
        clock,
        gate,
        backstops: BackstopCache::default(),
        rejections_seen: Mutex::default(),
        confirmed: Mutex::default(),
        confirms,
        resumed: Recent::default(),
    });

    // A clock verdict that changes, or this replica starting to lead, re-evaluates every
    // SingletonJob.
    let reconcile_all =
        futures::stream::select(WatchStream::from_changes(clock_rx).map(|_| ()), gate_opened);

    let (stop_tx, mut stop_rx) = watch::channel(());
    tokio::spawn(async move {
        shutdown.await;
        stop_tx.send_replace(());
    });

    // kube's graceful shutdown also waits for scheduled requeues (ours sleep until the next
    // period), which would hold up a handover. Once stopping, the gate is closed, so nothing
    // queued could write anyway: after a short grace for writes in flight, stop outright.
    let mut forceful_rx = stop_rx.clone();
    let forceful = async move {
        let _ = forceful_rx.changed().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    Controller::for_stream(sj_stream, sj_reader)
        .with_config(kube_controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES))
        .owns_stream(job_stream)
        .reconcile_all_on(reconcile_all)
        .reconcile_on(confirmed_runs)
        .graceful_shutdown_on(async move {
            // The controller wants a Sync future; a watch receiver is one.
            let _ = stop_rx.changed().await;
        })
        .run(reconcile, error_policy, ctx)
        .take_until(forceful)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile error");
            }
        })
        .await;
    Ok(())
}
