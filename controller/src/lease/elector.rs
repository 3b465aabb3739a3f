//! The elector: client-go's leader election rules over a [`Lock`].
//!
//! - Expiry is judged by *local monotonic* time since this process last saw the record change
//!   (`observed_at`), never by comparing the holder's `renewTime` with our wall clock: two clocks
//!   may disagree by any amount, but both measure durations well.
//! - The leader counts its renew deadline from the *start* of its last successful attempt. Anyone
//!   else starts counting the lease duration only after that write is visible, i.e. later; and
//!   `lease_duration > renew_deadline`, so the leader closes its gate before any other replica can
//!   consider the lease expired. The deadline timer is armed in every wait of the leader, so it
//!   fires even while a renew request hangs.
//! - Every write carries the observed resourceVersion; a 409 means another candidate won.
//! - `leaseTransitions` increments on every new grant and is the leader epoch.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use jiff::Timestamp;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use super::lock::{LeaderRecord, LeaseEvent, Lock, Versioned};
use crate::gate::{Gate, GateState};
use crate::{Error, Result};

/// Retry waits are stretched by up to this factor, so candidates do not retry in lockstep.
pub const JITTER_FACTOR: f64 = 1.2;

/// Durations and identity of one candidate.
#[derive(Clone, Debug)]
pub struct ElectionConfig {
    /// Unique per process (see [`super::identity`]).
    pub identity: String,
    /// How long others wait, after last seeing the record change, before taking the lease over.
    pub lease_duration: Duration,
    /// How long the leader keeps acting without a successful renewal.
    pub renew_deadline: Duration,
    /// How often candidates retry, and the leader retries a failed renewal.
    pub retry_period: Duration,
}

impl ElectionConfig {
    /// From seconds as given on the command line (fractions allowed, for fast tests); validated.
    pub fn from_secs(
        identity: String,
        lease_duration: f64,
        renew_deadline: f64,
        retry_period: f64,
    ) -> Result<Self> {
        let secs = |what: &str, v: f64| {
            Duration::try_from_secs_f64(v).map_err(|_| {
                Error::Config(format!(
                    "leader election: {what} must be a non-negative number of seconds, got {v}"
                ))
            })
        };
        let cfg = ElectionConfig {
            identity,
            lease_duration: secs("lease duration", lease_duration)?,
            renew_deadline: secs("renew deadline", renew_deadline)?,
            retry_period: secs("retry period", retry_period)?,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// client-go's rules: lease duration > renew deadline > retry period × jitter, all positive.
    /// The first gap is the margin in which a leader that stopped renewing is still the only one
    /// acting; the second makes sure a leader gets at least one retry before giving up.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(format!("leader election: {msg}")));
        if self.identity.is_empty() {
            return bad("identity must not be empty".into());
        }
        if self.retry_period.is_zero() {
            return bad("retry period must be positive".into());
        }
        if self.lease_duration <= self.renew_deadline {
            return bad(format!(
                "lease duration ({:?}) must be greater than the renew deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline.as_secs_f64() <= self.retry_period.as_secs_f64() * JITTER_FACTOR {
            return bad(format!(
                "renew deadline ({:?}) must be greater than {JITTER_FACTOR} × the retry period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        Ok(())
    }

    /// The leader renews about every third of the lease, and at least twice per renew deadline so
    /// one failed attempt still leaves time for retries.
    pub fn renew_interval(&self) -> Duration {
        (self.lease_duration / 3).min(self.renew_deadline / 2)
    }
}

/// What this replica is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Waiting for the lease, watching it.
    Standby,
    /// Holding the lease and allowed to act.
    Leader,
    /// Holding the lease but no longer acting: draining before a release.
    SteppingDown,
    /// Not taking part any more (released, lost, or shut down).
    Stopped,
}

/// The election as this replica sees it, published on a watch channel (health, logs, tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionState {
    pub role: Role,
    /// Holder of the lease as last observed; empty when free or unknown.
    pub holder: String,
    /// `leaseTransitions` of the record last observed: the current leader epoch.
    pub epoch: u64,
    /// Leader: when it stops acting unless it renews (last renewal + renew deadline).
    /// Standby: when the observed holder's lease expires by our clock.
    pub expires: Option<Instant>,
    /// The Lease watch has listed the Lease and is not failing.
    pub watching: bool,
    /// Last turn of the elector's loop (liveness).
    pub heartbeat: Instant,
}

/// How a call to [`Elector::hold`] ended.
#[derive(Debug)]
pub enum Held<T> {
    /// Leadership is lost (the gate is already closed). The reason is for the log.
    Lost(String),
    /// The `until` future resolved while still holding the lease.
    Until(T),
}

/// How a call to [`Elector::acquire`] ended.
#[derive(Debug)]
pub enum Acquired<T> {
    /// We hold the lease and the gate is open.
    Leading,
    /// The `until` future resolved first; still a standby (call again, or [`Elector::stop`]).
    Until(T),
}

/// Where this replica is in the election: one value, so that no impossible combination (leading
/// while stopped, acting while draining) can be represented. [`Phase::role`] is what it publishes.
#[derive(Clone, Copy, Debug)]
enum Phase {
    /// Not holding the lease; a grant makes it the leader.
    Standby,
    /// Holding the lease and acting. `renewed_at`: the start of the last successful acquire or
    /// renew attempt, from which the renew deadline counts.
    Leading { renewed_at: Instant },
    /// Holding the lease but never acting again: in-flight work drains before the release. It
    /// keeps renewing.
    Draining { renewed_at: Instant },
    /// Draining without the lease (lost it while draining, or told to drain as a standby): a
    /// grant makes it `Draining`, never `Leading`. Published as a standby, the closest [`Role`];
    /// a replica leaves the election right after.
    DrainingWithoutLease,
    /// Out of the election: released or stopped.
    Stopped,
}

impl Phase {
    fn role(self) -> Role {
        match self {
            Phase::Standby | Phase::DrainingWithoutLease => Role::Standby,
            Phase::Leading { .. } => Role::Leader,
            Phase::Draining { .. } => Role::SteppingDown,
            Phase::Stopped => Role::Stopped,
        }
    }

    /// When our hold of the lease was last renewed; None when we do not hold it.
    fn renewed_at(self) -> Option<Instant> {
        match self {
            Phase::Leading { renewed_at } | Phase::Draining { renewed_at } => Some(renewed_at),
            Phase::Standby | Phase::DrainingWithoutLease | Phase::Stopped => None,
        }
    }

    fn holds_lease(self) -> bool {
        self.renewed_at().is_some()
    }

    /// After our write, started at `renewed_at`, succeeded. Only a standby starts acting: a
    /// replica that began to leave never acts again, it only holds the lease until it releases.
    fn granted(self, renewed_at: Instant) -> Phase {
        match self {
            Phase::Standby | Phase::Leading { .. } => Phase::Leading { renewed_at },
            Phase::Draining { .. } | Phase::DrainingWithoutLease | Phase::Stopped => {
                Phase::Draining { renewed_at }
            }
        }
    }

    /// After the lease is lost.
    fn lost(self) -> Phase {
        match self {
            Phase::Leading { .. } => Phase::Standby,
            Phase::Draining { .. } => Phase::DrainingWithoutLease,
            not_held @ (Phase::Standby | Phase::DrainingWithoutLease | Phase::Stopped) => not_held,
        }
    }

    /// After being told to drain.
    fn draining(self) -> Phase {
        match self {
            Phase::Leading { renewed_at } => Phase::Draining { renewed_at },
            Phase::Standby => Phase::DrainingWithoutLease,
            leaving @ (Phase::Draining { .. } | Phase::DrainingWithoutLease | Phase::Stopped) => {
                leaving
            }
        }
    }
}

/// The Lease watch, and whether it works.
enum LeaseWatch {
    /// Not listed yet, or failing (it retries by itself).
    Starting(BoxStream<'static, LeaseEvent>),
    /// Has listed the Lease and is not failing.
    Watching(BoxStream<'static, LeaseEvent>),
    /// Ended (not expected: the watch retries forever); polling at the retry period still works.
    Ended,
}

impl LeaseWatch {
    fn is_watching(&self) -> bool {
        matches!(self, LeaseWatch::Watching(_))
    }

    /// After an event: whether the watch works now.
    fn set_working(&mut self, working: bool) {
        *self = match std::mem::replace(self, LeaseWatch::Ended) {
            LeaseWatch::Starting(s) | LeaseWatch::Watching(s) if working => LeaseWatch::Watching(s),
            LeaseWatch::Starting(s) | LeaseWatch::Watching(s) => LeaseWatch::Starting(s),
            LeaseWatch::Ended => LeaseWatch::Ended,
        };
    }

    /// The next event; pending forever once the watch has ended.
    async fn next(&mut self) -> Option<LeaseEvent> {
        match self {
            LeaseWatch::Starting(s) | LeaseWatch::Watching(s) => s.next().await,
            LeaseWatch::Ended => std::future::pending().await,
        }
    }
}

/// One candidate for the lease.
pub struct Elector<L: Lock> {
    lock: L,
    cfg: ElectionConfig,
    watch: LeaseWatch,
    /// The record as last read, watched or written, and when (locally) it last changed.
    observed: Option<Versioned>,
    observed_at: Instant,
    phase: Phase,
    gate: watch::Sender<GateState>,
    state: watch::Sender<ElectionState>,
    rng: u64,
}

impl<L: Lock> Elector<L> {
    /// A candidate that has not tried yet: its gate is closed. `events` is the Lease watch
    /// ([`super::lock::watch_lease`]); pass an empty stream to rely on polling alone.
    pub fn new(
        lock: L,
        cfg: ElectionConfig,
        events: BoxStream<'static, LeaseEvent>,
    ) -> Result<Self> {
        cfg.validate()?;
        let now = Instant::now();
        let (gate, _) = watch::channel(GateState {
            may_act: false,
            epoch: 0,
            valid_until: None,
        });
        let (state, _) = watch::channel(ElectionState {
            role: Role::Standby,
            holder: String::new(),
            epoch: 0,
            expires: None,
            watching: false,
            heartbeat: now,
        });
        // Seeded by the OS (RandomState), so replicas started together jitter differently.
        let rng = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
            | 1;
        Ok(Elector {
            lock,
            cfg,
            watch: LeaseWatch::Starting(events),
            observed: None,
            observed_at: now,
            phase: Phase::Standby,
            gate,
            state,
            rng,
        })
    }

    /// The gate the run path checks before each write.
    pub fn gate(&self) -> Gate {
        Gate::new(self.gate.subscribe())
    }

    pub fn state(&self) -> watch::Receiver<ElectionState> {
        self.state.subscribe()
    }

    pub fn config(&self) -> &ElectionConfig {
        &self.cfg
    }

    /// Whether this replica holds the lease (acting, or draining before its release).
    pub fn is_leading(&self) -> bool {
        self.phase.holds_lease()
    }

    /// Takes note of the record as read or watched. Only a change (another resourceVersion)
    /// restarts the local expiry clock, so a holder that stopped renewing expires after exactly
    /// one lease duration of local time, whatever its `renewTime` says.
    pub fn observe(&mut self, seen: Option<Versioned>, now: Instant) {
        if let (Some(a), Some(b)) = (&self.observed, &seen)
            && older(&b.resource_version, &a.resource_version)
        {
            // A late watch event: the record before one we already know (our own grant, or a
            // read), not news. Taken as a change, it would show a leader the previous holder
            // and make it step down for nothing.
            return;
        }
        let changed = match (&self.observed, &seen) {
            (Some(a), Some(b)) => a.resource_version != b.resource_version || a.record != b.record,
            (None, None) => false,
            _ => true,
        };
        if changed {
            tracing::debug!(lease = %self.lock.describe(), holder = seen.as_ref().map(|v| v.record.holder.as_str()).unwrap_or(""), "lease record changed");
            self.observed = seen;
            self.observed_at = now;
        }
        // A leader that sees someone else's record has lost, whatever its deadline says.
        if self.phase.holds_lease() && self.held_by_other(now) {
            self.step_down("another candidate holds the lease");
        }
        self.publish();
    }

    /// The lease duration the observed record asks for (ours if it states none).
    fn observed_duration(&self) -> Duration {
        match &self.observed {
            Some(v) if !v.record.lease_duration.is_zero() => v.record.lease_duration,
            _ => self.cfg.lease_duration,
        }
    }

    /// When the observed holder's lease expires by our clock; None if nobody else holds it.
    fn other_expiry(&self) -> Option<Instant> {
        let v = self.observed.as_ref()?;
        let holder = &v.record.holder;
        (!holder.is_empty() && *holder != self.cfg.identity)
            .then(|| self.observed_at + self.observed_duration())
    }

    fn held_by_other(&self, now: Instant) -> bool {
        self.other_expiry().is_some_and(|exp| now < exp)
    }

    /// One round of client-go's `tryAcquireOrRenew`. Ok(true) when we hold the lease afterwards.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool> {
        // 1. The moment of the attempt. A success counts from here, not from the reply: the
        //    write cannot be visible to anyone before we sent it.
        let started = Instant::now();
        let wall = Timestamp::now();
        let me = self.cfg.identity.clone();

        // 2. Read the current record.
        let Some(current) = self.lock.get().await? else {
            // 3. No Lease yet: create it. Its first grant is epoch 1 (0 means "no election").
            let record = LeaderRecord {
                holder: me,
                lease_duration: self.cfg.lease_duration,
                acquire_time: Some(wall),
                renew_time: Some(wall),
                transitions: 1,
            };
            return match self.lock.create(&record).await {
                Ok(v) => Ok(self.granted(v, started)),
                // Someone else created it first.
                Err(Error::Conflict(_)) => Ok(false),
                Err(e) => Err(e),
            };
        };

        // 4. Restart the expiry clock if the record changed since we last saw it.
        self.observe(Some(current.clone()), Instant::now());

        // 5. Held by someone else whose lease has not expired by our clock: not ours to take.
        if self.held_by_other(Instant::now()) {
            return Ok(false);
        }

        // 6. The new record. A renewal keeps the acquire time and the epoch; any other grant
        //    (a free, expired, or our own stale record) starts a new epoch.
        let renewing = self.phase.holds_lease() && current.record.holder == me;
        let record = if renewing {
            LeaderRecord {
                renew_time: Some(wall),
                lease_duration: self.cfg.lease_duration,
                ..current.record.clone()
            }
        } else {
            LeaderRecord {
                holder: me,
                lease_duration: self.cfg.lease_duration,
                acquire_time: Some(wall),
                renew_time: Some(wall),
                transitions: current.record.transitions + 1,
            }
        };

        // 7. Compare-and-swap on the observed resourceVersion: a 409 means we lost a race.
        match self.lock.update(&current, &record).await {
            Ok(v) => Ok(self.granted(v, started)),
            Err(Error::Conflict(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Our write `v`, started at `started`, succeeded.
    fn granted(&mut self, v: Versioned, started: Instant) -> bool {
        let epoch = v.record.transitions;
        let new_term = !self.phase.holds_lease();
        self.observed = Some(v);
        self.observed_at = started;
        self.phase = self.phase.granted(started);
        if new_term {
            tracing::info!(lease = %self.lock.describe(), identity = %self.cfg.identity, epoch, "became leader");
        }
        self.publish();
        true
    }

    /// The lease is lost: stops acting at once, the gate closed before anything else happens.
    fn step_down(&mut self, why: &str) {
        let next = self.phase.lost();
        self.step_down_to(next, why);
    }

    /// Closes the gate, then moves on to `next`.
    fn step_down_to(&mut self, next: Phase, why: &str) {
        self.gate.send_replace(GateState {
            may_act: false,
            epoch: self.epoch(),
            valid_until: None,
        });
        if self.phase.holds_lease() {
            tracing::warn!(lease = %self.lock.describe(), identity = %self.cfg.identity, epoch = self.epoch(), reason = why, "stopped leading");
            crate::metrics::global().stopped_leading();
        }
        self.phase = next;
        self.publish();
    }

    fn epoch(&self) -> u64 {
        self.observed
            .as_ref()
            .map(|v| v.record.transitions)
            .unwrap_or(0)
    }

    /// Publishes the gate and the state. The gate only ever opens here, for a leader that is
    /// not draining.
    fn publish(&mut self) {
        let deadline = self
            .phase
            .renewed_at()
            .map(|renewed_at| renewed_at + self.cfg.renew_deadline);
        let may_act = matches!(self.phase, Phase::Leading { .. });
        let gate = GateState {
            may_act,
            epoch: self.epoch(),
            // The gate closes by itself at the renew deadline, even if this loop is not scheduled
            // then (a paused process resumes with work that checks the gate before we run).
            valid_until: deadline.filter(|_| may_act),
        };
        crate::metrics::global().leader.set(i64::from(may_act));
        crate::metrics::global()
            .leader_epoch
            .set(self.epoch() as i64);
        self.gate.send_if_modified(|g| {
            let changed = *g != gate;
            *g = gate;
            changed
        });
        let state = ElectionState {
            role: self.phase.role(),
            holder: self
                .observed
                .as_ref()
                .map(|v| v.record.holder.clone())
                .unwrap_or_default(),
            epoch: self.epoch(),
            expires: deadline.or_else(|| self.other_expiry()),
            watching: self.watch.is_watching(),
            heartbeat: Instant::now(),
        };
        self.state.send_replace(state);
    }

    fn handle_event(&mut self, ev: Option<LeaseEvent>) {
        match ev {
            Some(LeaseEvent::Observed(v)) => {
                self.watch.set_working(true);
                self.observe(v, Instant::now());
            }
            Some(LeaseEvent::WatchError(e)) => {
                if self.watch.is_watching() {
                    tracing::warn!(lease = %self.lock.describe(), error = %e, "lease watch failed; retrying");
                }
                self.watch.set_working(false);
                self.publish();
            }
            None => {
                tracing::warn!(lease = %self.lock.describe(), "lease watch ended");
                self.watch = LeaseWatch::Ended;
                self.publish();
            }
        }
    }

    /// The retry period stretched by a random factor in [1, JITTER_FACTOR).
    fn jittered_retry(&mut self) -> Duration {
        // xorshift64: plenty for spreading retries.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let unit = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        self.cfg
            .retry_period
            .mul_f64(1.0 + (JITTER_FACTOR - 1.0) * unit)
    }

    /// Standby: tries at once, then every retry period, and at once whenever the watch shows the
    /// lease free (released, deleted) or the observed holder's lease expires. Returns when
    /// leading, or when `until` resolved first.
    pub async fn acquire<T>(&mut self, until: impl Future<Output = T>) -> Acquired<T> {
        tokio::pin!(until);
        let standby_since = Instant::now();
        let mut next_try = Instant::now();
        loop {
            self.publish();
            enum Wake<T> {
                Until(T),
                Event(Option<LeaseEvent>),
                Try,
            }
            let wake = tokio::select! {
                biased;
                v = &mut until => Wake::Until(v),
                ev = self.watch.next() => Wake::Event(ev),
                _ = sleep_until(next_try) => Wake::Try,
            };
            match wake {
                Wake::Until(v) => return Acquired::Until(v),
                Wake::Event(ev) => {
                    self.handle_event(ev);
                    let now = Instant::now();
                    let free = match &self.observed {
                        None => true,
                        Some(v) => v.record.holder.is_empty(),
                    };
                    if free {
                        next_try = now;
                    } else if let Some(exp) = self.other_expiry() {
                        next_try = next_try.min(exp.max(now));
                    }
                }
                Wake::Try => {
                    // A hung request must not wedge the standby: give up after the renew deadline.
                    let attempt =
                        tokio::time::timeout(self.cfg.renew_deadline, self.try_acquire_or_renew())
                            .await;
                    let metrics = crate::metrics::global();
                    match attempt {
                        Ok(Ok(true)) => {
                            metrics.started_leading(standby_since);
                            return Acquired::Leading;
                        }
                        Ok(Ok(false)) => metrics.acquire_attempt_failed("Contention"),
                        Ok(Err(e)) => {
                            metrics.acquire_attempt_failed("Error");
                            tracing::warn!(lease = %self.lock.describe(), error = %e, "could not acquire the lease")
                        }
                        Err(_) => {
                            metrics.acquire_attempt_failed("Timeout");
                            tracing::warn!(lease = %self.lock.describe(), "acquiring the lease timed out")
                        }
                    }
                    let now = Instant::now();
                    next_try = now + self.jittered_retry();
                    if let Some(exp) = self.other_expiry().filter(|e| *e > now) {
                        next_try = next_try.min(exp);
                    }
                }
            }
        }
    }

    /// Leader: renews every [`ElectionConfig::renew_interval`], retries failures every retry
    /// period, and steps down (gate closed first) the moment the renew deadline passes without a
    /// successful renewal, or the lease shows another holder. Returns when leadership is lost or
    /// `until` resolves (still leading).
    pub async fn hold<T>(&mut self, until: impl Future<Output = T>) -> Held<T> {
        tokio::pin!(until);
        let Some(renewed_at) = self.phase.renewed_at() else {
            return Held::Lost("not leading".into());
        };
        let mut next_try = renewed_at + self.cfg.renew_interval();
        loop {
            self.publish();
            let Some(renewed_at) = self.phase.renewed_at() else {
                return Held::Lost("another candidate holds the lease".into());
            };
            let deadline = renewed_at + self.cfg.renew_deadline;
            enum Wake<T> {
                Deadline,
                Until(T),
                Event(Option<LeaseEvent>),
                Try,
            }
            // The deadline comes first: after a pause (SIGSTOP, a stalled VM) every timer is
            // due at once, and stepping down must win.
            let wake = tokio::select! {
                biased;
                _ = sleep_until(deadline) => Wake::Deadline,
                v = &mut until => Wake::Until(v),
                ev = self.watch.next() => Wake::Event(ev),
                _ = sleep_until(next_try) => Wake::Try,
            };
            match wake {
                Wake::Deadline => return self.lost_deadline(),
                Wake::Until(v) => return Held::Until(v),
                Wake::Event(ev) => self.handle_event(ev),
                Wake::Try => {
                    let attempt = tokio::select! {
                        biased;
                        _ = sleep_until(deadline) => None,
                        r = self.try_acquire_or_renew() => Some(r),
                    };
                    if !matches!(attempt, Some(Ok(true))) {
                        crate::metrics::global().lease_renew_failures.inc();
                    }
                    match attempt {
                        None => return self.lost_deadline(),
                        Some(Ok(true)) => {
                            // Always held after a grant (Leading, or Draining).
                            if let Some(renewed_at) = self.phase.renewed_at() {
                                next_try = renewed_at + self.cfg.renew_interval();
                            }
                        }
                        Some(Ok(false)) => {
                            if self.held_by_other(Instant::now()) {
                                self.step_down("another candidate holds the lease");
                                return Held::Lost("another candidate holds the lease".into());
                            }
                            // A 409 from an unrelated edit of the Lease: read again soon.
                            next_try = Instant::now() + self.cfg.retry_period;
                        }
                        Some(Err(e)) => {
                            tracing::warn!(lease = %self.lock.describe(), error = %e, "could not renew the lease");
                            next_try = Instant::now() + self.cfg.retry_period;
                        }
                    }
                }
            }
        }
    }

    fn lost_deadline<T>(&mut self) -> Held<T> {
        self.step_down("renew deadline passed without a successful renewal");
        Held::Lost(format!(
            "no successful renewal within the renew deadline ({:?})",
            self.cfg.renew_deadline
        ))
    }

    /// Leaves the election without holding the lease (a standby shutting down).
    pub fn stop(&mut self) {
        self.step_down_to(Phase::Stopped, "stopped");
    }

    /// Stops acting (closes the gate for good) but keeps holding the lease, so in-flight work can
    /// finish before [`Elector::release`].
    pub fn begin_drain(&mut self) {
        self.phase = self.phase.draining();
        self.gate.send_replace(GateState {
            may_act: false,
            epoch: self.epoch(),
            valid_until: None,
        });
        self.publish();
    }

    /// Gives the lease up (holder cleared, with the resourceVersion precondition) so a standby
    /// takes over at once instead of waiting for expiry. Ok(false) if it was no longer ours.
    pub async fn release(&mut self) -> Result<bool> {
        self.begin_drain();
        let was_leading = self.phase.holds_lease();
        if was_leading {
            crate::metrics::global().stopped_leading();
        }
        self.phase = Phase::Stopped;
        self.publish();
        let Some(current) = self.observed.clone() else {
            return Ok(false);
        };
        if !was_leading || current.record.holder != self.cfg.identity {
            return Ok(false);
        }
        let record = LeaderRecord {
            holder: String::new(),
            // As client-go: a released record asks nobody to wait.
            lease_duration: Duration::from_secs(1),
            acquire_time: None,
            renew_time: None,
            transitions: current.record.transitions,
        };
        match self.lock.update(&current, &record).await {
            Ok(v) => {
                tracing::info!(lease = %self.lock.describe(), identity = %self.cfg.identity, epoch = record.transitions, "released the lease");
                self.observed = Some(v);
                self.observed_at = Instant::now();
                self.publish();
                Ok(true)
            }
            // Someone else wrote since: it is not ours to release any more.
            Err(Error::Conflict(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Whether resourceVersion `a` is older than `b`. The API server's are integers that rise with
/// every write (etcd's revision), and one object's versions are comparable; anything else is
/// never judged older, so it counts as a change, as before.
fn older(a: &str, b: &str) -> bool {
    matches!((a.parse::<u64>(), b.parse::<u64>()), (Ok(a), Ok(b)) if a < b)
}
