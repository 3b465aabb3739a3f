//! Prometheus metrics, served as OpenMetrics text on `/metrics` of the health server
//! ([`crate::endpoints`]). Every name starts with `singleton_`; docs/observability.md says what
//! each one means and what to do when it moves.
//!
//! One process-wide registry ([`global`]), created on first use. Not an `Arc<Metrics>` in the
//! controller's `Context` and the elector: a process serves one `/metrics`, so there is exactly one
//! registry either way, and a static keeps each instrumentation point to a line, without new
//! constructor arguments for every `Context` and `Elector` built in tests. Tests that check the
//! rendering build their own [`Metrics`] with [`Metrics::new`].
//!
//! Labels are bounded: a SingletonJob's namespace and name, and fixed words (enum variant names,
//! the reason constants of [`crate::decide::reason`], [`crate::Error::kind`]); never a message.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use tokio::time::Instant;

use crate::Error;
use crate::api::{HistoryEntry, Outcome, SingletonJob};

/// The `Content-Type` of `/metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `schedule_skew_seconds` buckets: 5 ms to 512 s. From 1 s on they are CronJob's own
/// (`cronjob_controller_job_creation_skew_duration_seconds`: 1, 2, 4, ..., 512), so the two
/// histograms compare bucket by bucket; below 1 s a 1-2.5-5 series resolves a healthy skew.
pub const SKEW_BUCKETS: [f64; 17] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0,
    512.0,
];

/// The process-wide metrics.
pub fn global() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub namespace: String,
    pub name: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub namespace: String,
    pub name: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub namespace: String,
    pub name: String,
    /// `controller` (its own writes) or `workload` (the backstop's `fence()` refusals).
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub namespace: String,
    pub name: String,
    /// A [`PreparedStage`]'s name.
    pub stage: String,
}

/// How far a prepared run got (`singleton_prepared_runs_total`); withdrawals are also counted by
/// reason in `singleton_runs_withdrawn_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreparedStage {
    /// Claimed, created suspended and confirmed ahead of its instant.
    Prepared,
    /// Resumed by the one request at its instant.
    Resumed,
    /// Withdrawn before it ran (its Job never ran).
    Withdrawn,
}

impl PreparedStage {
    pub const ALL: [PreparedStage; 3] = [
        PreparedStage::Prepared,
        PreparedStage::Resumed,
        PreparedStage::Withdrawn,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PreparedStage::Prepared => "Prepared",
            PreparedStage::Resumed => "Resumed",
            PreparedStage::Withdrawn => "Withdrawn",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpErrorLabels {
    pub op: String,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    /// `Contention` (held by another replica, or a lost compare-and-swap), `Error`, `Timeout`.
    pub reason: String,
}

/// Labels of `singleton_multicluster_claims_total`: this controller's cluster identity (one value
/// per process, from `--cluster-id`) and the backstop claim's result (a variant name).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterClaimLabels {
    pub cluster: String,
    /// `Claimed`, `Duplicate`, `ClaimedElsewhere`, `TookOver`, `NotYet`.
    pub result: String,
}

/// Labels of `singleton_notifications_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NotifyLabels {
    pub namespace: String,
    pub name: String,
    /// A [`NotifyResult`] variant's name.
    pub result: String,
}

/// What became of a notification's try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotifyResult {
    /// The receiver accepted it.
    Delivered,
    /// A try failed (it is tried again).
    Failed,
    /// Tried for `giveUpAfterSeconds` in vain.
    GaveUp,
}

impl NotifyResult {
    pub const ALL: [NotifyResult; 3] = [
        NotifyResult::Delivered,
        NotifyResult::Failed,
        NotifyResult::GaveUp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            NotifyResult::Delivered => "Delivered",
            NotifyResult::Failed => "Failed",
            NotifyResult::GaveUp => "GaveUp",
        }
    }
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn backstop_histogram() -> Histogram {
    // 1 ms .. 8.2 s: the default operation timeout is a few seconds.
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// Every metric of the controller, and the registry that renders them.
pub struct Metrics {
    registry: Registry,
    // Election.
    pub leader: Gauge,
    pub leader_epoch: Gauge,
    pub leader_transitions: Counter,
    pub lease_acquire_seconds: Histogram,
    pub leader_hold_seconds: Histogram,
    pub lease_renew_failures: Counter,
    pub lease_acquire_attempts_failed: Family<AttemptLabels, Counter>,
    // Runs.
    pub runs_started: Family<JobLabels, Counter>,
    pub runs_finished: Family<OutcomeLabels, Counter>,
    pub periods_missed: Family<ReasonLabels, Counter>,
    pub periods_skipped: Family<ReasonLabels, Counter>,
    pub claims_conflicted: Family<JobLabels, Counter>,
    pub multicluster_claims: Family<ClusterClaimLabels, Counter>,
    pub claims_deduplicated: Family<JobLabels, Counter>,
    pub runs_withdrawn: Family<ReasonLabels, Counter>,
    pub prepared_runs: Family<StageLabels, Counter>,
    pub prepare_lead_seconds: Gauge,
    pub runs_late: Family<JobLabels, Counter>,
    pub suspended_after_failures: Family<JobLabels, Counter>,
    pub schedule_skew_seconds: Histogram,
    next_runs: std::sync::Arc<NextRuns>,
    // Fencing.
    pub tokens_issued: Family<JobLabels, Counter>,
    pub stale_writes_refused: Family<SourceLabels, Counter>,
    // Notifications.
    pub notifications: Family<NotifyLabels, Counter>,
    // Backstop and clock.
    pub backstop_operation_seconds: HistogramFamily<OpLabels>,
    pub backstop_errors: Family<OpErrorLabels, Counter>,
    pub backstop_deferred: Family<JobLabels, Counter>,
    pub clock_offset_seconds: Gauge<f64, AtomicU64>,
    // Reconcile.
    pub reconcile_duration_seconds: Histogram,
    pub reconcile_errors: Family<KindLabels, Counter>,
    pub undecodable: Family<JobLabels, Gauge>,
    /// When this replica last started leading (for `leader_hold_seconds`).
    leading_since: Mutex<Option<Instant>>,
    /// Every SingletonJob with a series, and the reasons of its periods_* series, so a deleted
    /// one's series can all be removed ([`Metrics::forget`]).
    series: Mutex<HashMap<JobLabels, std::collections::BTreeSet<String>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    // One piece: every metric is registered here, so the registry reads as one list of names
    // and help texts.
    pub fn new() -> Self {
        let mut m = Metrics {
            registry: Registry::with_prefix("singleton"),
            leader: Gauge::default(),
            leader_epoch: Gauge::default(),
            leader_transitions: Counter::default(),
            // 50 ms .. 410 s: a takeover waits at most a lease duration plus a retry.
            lease_acquire_seconds: Histogram::new(exponential_buckets(0.05, 2.0, 14)),
            // 1 s .. 3 days.
            leader_hold_seconds: Histogram::new(exponential_buckets(1.0, 4.0, 10)),
            lease_renew_failures: Counter::default(),
            lease_acquire_attempts_failed: Family::default(),
            runs_started: Family::default(),
            runs_finished: Family::default(),
            periods_missed: Family::default(),
            periods_skipped: Family::default(),
            claims_conflicted: Family::default(),
            multicluster_claims: Family::default(),
            claims_deduplicated: Family::default(),
            runs_withdrawn: Family::default(),
            prepared_runs: Family::default(),
            prepare_lead_seconds: Gauge::default(),
            runs_late: Family::default(),
            suspended_after_failures: Family::default(),
            schedule_skew_seconds: Histogram::new(SKEW_BUCKETS),
            next_runs: Default::default(),
            tokens_issued: Family::default(),
            stale_writes_refused: Family::default(),
            notifications: Family::default(),
            backstop_operation_seconds: Family::new_with_constructor(backstop_histogram),
            backstop_errors: Family::default(),
            backstop_deferred: Family::default(),
            clock_offset_seconds: Gauge::default(),
            // 1 ms .. 16 s.
            reconcile_duration_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            reconcile_errors: Family::default(),
            undecodable: Family::default(),
            leading_since: Mutex::new(None),
            series: Mutex::default(),
        };
        let r = &mut m.registry;
        let s = Unit::Seconds;
        r.register(
            "leader",
            "1 while this replica leads and may act, else 0",
            m.leader.clone(),
        );
        r.register(
            "leader_epoch",
            "The Lease's leaseTransitions as this replica last saw it (the leader epoch)",
            m.leader_epoch.clone(),
        );
        r.register(
            "leader_transitions",
            "Times this replica started leading",
            m.leader_transitions.clone(),
        );
        r.register_with_unit(
            "lease_acquire",
            "Time from standing by to leading",
            s.clone(),
            m.lease_acquire_seconds.clone(),
        );
        r.register_with_unit(
            "leader_hold",
            "How long this replica led, observed when it stopped",
            s.clone(),
            m.leader_hold_seconds.clone(),
        );
        r.register(
            "lease_renew_failures",
            "Lease renewals by the leader that failed (error, lost race or deadline)",
            m.lease_renew_failures.clone(),
        );
        r.register(
            "lease_acquire_attempts_failed",
            "Attempts of a standby to take the Lease that did not win it, by reason",
            m.lease_acquire_attempts_failed.clone(),
        );
        r.register(
            "runs_started",
            "Jobs created, one per run",
            m.runs_started.clone(),
        );
        r.register(
            "runs_finished",
            "Runs decided, by outcome (Succeeded, Failed, Replaced)",
            m.runs_finished.clone(),
        );
        r.register(
            "periods_missed",
            "Periods not started in time, by reason (folded ranges count each period)",
            m.periods_missed.clone(),
        );
        r.register(
            "periods_skipped",
            "Periods deliberately not run, by reason (folded ranges count each period)",
            m.periods_skipped.clone(),
        );
        r.register(
            "claims_conflicted",
            "Period claims refused by the API server with 409 Conflict (someone else wrote first)",
            m.claims_conflicted.clone(),
        );
        r.register(
            "multicluster_claims",
            "Backstop claims by this cluster (--cluster-id) and result: Claimed, Duplicate, ClaimedElsewhere (another cluster has the period), TookOver, NotYet (a standby before its delay, or an unconfirmed claim of another cluster within the takeover bound)",
            m.multicluster_claims.clone(),
        );
        r.register(
            "claims_deduplicated",
            "Periods found already claimed in the backstop: no Job created",
            m.claims_deduplicated.clone(),
        );
        r.register(
            "runs_withdrawn",
            "Prepared runs withdrawn before their instant (their Job never ran), by reason (a WithdrawReason: Suspended, ScheduleChanged, SpecChanged, ...)",
            m.runs_withdrawn.clone(),
        );
        r.register(
            "prepared_runs",
            "Runs prepared ahead of their instant (spec.prepareLeadSeconds, --prepare-lead-seconds), by stage: Prepared (claimed, created suspended and confirmed), Resumed (started at the instant by one request), Withdrawn (never ran; by reason in singleton_runs_withdrawn_total)",
            m.prepared_runs.clone(),
        );
        r.register_with_unit(
            "prepare_lead",
            "The largest lead last computed for an upcoming instant: the base lead (spec.prepareLeadSeconds, --prepare-lead-seconds) raised for a burst of runs due at one instant, at most --prepare-max-lead-seconds",
            s.clone(),
            m.prepare_lead_seconds.clone(),
        );
        r.register(
            "runs_late",
            "Runs that had not succeeded by their period's completion deadline (completionDeadlineSeconds)",
            m.runs_late.clone(),
        );
        r.register(
            "suspended_after_failures",
            "Times a SingletonJob was suspended by suspendAfterConsecutiveFailures",
            m.suspended_after_failures.clone(),
        );
        r.register_with_unit(
            "schedule_skew",
            "When a run's Job was allowed to run (resumed after its confirm) minus the scheduled instant",
            s.clone(),
            m.schedule_skew_seconds.clone(),
        );
        r.register_collector(Box::new(m.next_runs.clone()));
        r.register(
            "tokens_issued",
            "Fencing tokens issued (period claims written)",
            m.tokens_issued.clone(),
        );
        r.register("stale_writes_refused", "Writes refused for a stale token or lost leadership: source=controller counts this process's own status writes (409 or gate closed); source=workload is the backstop database's count of fence() refusals, sampled on each reconcile", m.stale_writes_refused.clone());
        r.register(
            "notifications",
            "Notification tries by result: Delivered (the receiver accepted the event), Failed (a try failed; it is tried again), GaveUp (tried for giveUpAfterSeconds in vain, dropped)",
            m.notifications.clone(),
        );
        r.register_with_unit(
            "backstop_operation",
            "Duration of backstop database operations",
            s.clone(),
            m.backstop_operation_seconds.clone(),
        );
        r.register(
            "backstop_errors",
            "Failed backstop database operations, by operation and error kind",
            m.backstop_errors.clone(),
        );
        r.register(
            "backstop_deferred",
            "Reconciles put off because their namespace's database time in flight was spent: its backstop database is slow, and only its own namespace waits",
            m.backstop_deferred.clone(),
        );
        r.register_with_unit(
            "clock_offset",
            "API server clock minus local clock, last measured",
            s.clone(),
            m.clock_offset_seconds.clone(),
        );
        r.register_with_unit(
            "reconcile_duration",
            "Duration of reconciles by the acting replica",
            s,
            m.reconcile_duration_seconds.clone(),
        );
        r.register(
            "reconcile_errors",
            "Reconciles that ended in an error, by kind",
            m.reconcile_errors.clone(),
        );
        r.register(
            "undecodable_singletonjobs",
            "1 for each SingletonJob the controller cannot decode (nested too deep): nothing is scheduled for it until it is fixed; its Ready condition says why",
            m.undecodable.clone(),
        );
        m
    }

    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    // --- Election ---------------------------------------------------------------------------

    /// This replica won the Lease after standing by since `standby_since`.
    pub fn started_leading(&self, standby_since: Instant) {
        let now = Instant::now();
        self.leader_transitions.inc();
        self.lease_acquire_seconds
            .observe(now.duration_since(standby_since).as_secs_f64());
        *crate::sync::lock(&self.leading_since) = Some(now);
    }

    /// This replica stopped leading (lost, released or shut down); once per term.
    pub fn stopped_leading(&self) {
        let since = crate::sync::lock(&self.leading_since).take();
        if let Some(t) = since {
            self.leader_hold_seconds.observe(t.elapsed().as_secs_f64());
        }
    }

    /// A standby's attempt did not win the Lease: `Contention`, `Error` or `Timeout`.
    pub fn acquire_attempt_failed(&self, reason: &str) {
        self.lease_acquire_attempts_failed
            .get_or_create(&AttemptLabels {
                reason: reason.into(),
            })
            .inc();
    }

    // --- Runs -------------------------------------------------------------------------------

    /// A period claim was written: a token was issued.
    pub fn token_issued(&self, sj: &SingletonJob) {
        self.tokens_issued.get_or_create(&self.job(sj)).inc();
    }

    /// A backstop claim by `cluster` ended with `result` (a `ClaimOutcome` variant name;
    /// counted for every backstop claim, with an empty cluster when there is no identity).
    pub fn multi_cluster_claim(&self, cluster: &str, result: &'static str) {
        self.multicluster_claims
            .get_or_create(&ClusterClaimLabels {
                cluster: cluster.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// The claim's status write failed; counts a 409.
    pub fn claim_failed(&self, sj: &SingletonJob, err: &Error) {
        if matches!(err, Error::Conflict(_)) {
            self.claims_conflicted.get_or_create(&self.job(sj)).inc();
        }
    }

    /// The Job of the run for `period` was created.
    pub fn run_started(&self, sj: &SingletonJob, period: Timestamp, started: Timestamp) {
        self.runs_started.get_or_create(&self.job(sj)).inc();
        let skew = started.duration_since(period).as_secs_f64();
        self.schedule_skew_seconds.observe(skew.max(0.0));
    }

    /// A run ended with `outcome` (Succeeded, Failed, Replaced).
    pub fn run_finished(&self, sj: &SingletonJob, outcome: Outcome) {
        let JobLabels { namespace, name } = self.job(sj);
        self.runs_finished
            .get_or_create(&OutcomeLabels {
                namespace,
                name,
                outcome: outcome.name().to_string(),
            })
            .inc();
    }

    /// A run passed its completion deadline without succeeding.
    pub fn run_late(&self, sj: &SingletonJob) {
        self.runs_late.get_or_create(&self.job(sj)).inc();
    }

    /// `suspendAfterConsecutiveFailures` suspended a SingletonJob.
    pub fn suspended_after_failures(&self, sj: &SingletonJob) {
        self.suspended_after_failures
            .get_or_create(&self.job(sj))
            .inc();
    }

    /// A prepared run was withdrawn; `reason` is a `WithdrawReason`'s name.
    pub fn run_withdrawn(&self, sj: &SingletonJob, reason: &'static str) {
        let key = self.job(sj);
        if let Some(reasons) = crate::sync::lock(&self.series).get_mut(&key) {
            reasons.insert(reason.to_string());
        }
        self.runs_withdrawn
            .get_or_create(&ReasonLabels {
                namespace: key.namespace,
                name: key.name,
                reason: reason.to_string(),
            })
            .inc();
    }

    /// A prepared run reached `stage`.
    pub fn prepared(&self, sj: &SingletonJob, stage: PreparedStage) {
        let key = self.job(sj);
        self.prepared_runs
            .get_or_create(&StageLabels {
                namespace: key.namespace,
                name: key.name,
                stage: stage.name().to_string(),
            })
            .inc();
    }

    /// The largest lead last computed for an upcoming instant (whole seconds).
    pub fn prepare_lead(&self, lead: SignedDuration) {
        self.prepare_lead_seconds.set(lead.as_secs());
    }

    /// A period's outcome was recorded in status (a history entry).
    pub fn recorded(&self, sj: &SingletonJob, e: &HistoryEntry) {
        let key = self.job(sj);
        let why = e.reason.clone().unwrap_or_else(|| "Unknown".into());
        if matches!(e.outcome, Outcome::Missed | Outcome::Skipped)
            && let Some(reasons) = crate::sync::lock(&self.series).get_mut(&key)
        {
            reasons.insert(why.clone());
        }
        let reason = || ReasonLabels {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            reason: why.clone(),
        };
        match e.outcome {
            Outcome::Running => {}
            Outcome::Succeeded | Outcome::Failed | Outcome::Replaced => {
                self.run_finished(sj, e.outcome)
            }
            Outcome::Missed => {
                self.periods_missed
                    .get_or_create(&reason())
                    .inc_by(e.count.max(1));
            }
            Outcome::Skipped => {
                self.periods_skipped
                    .get_or_create(&reason())
                    .inc_by(e.count.max(1));
            }
            Outcome::Deduplicated => {
                self.claims_deduplicated
                    .get_or_create(&key)
                    .inc_by(e.count.max(1));
            }
        }
    }

    /// A notification of the SingletonJob `namespace/name` was tried, with `result`.
    pub fn notification(&self, namespace: &str, name: &str, result: NotifyResult) {
        self.notifications
            .get_or_create(&NotifyLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
                result: result.name().to_string(),
            })
            .inc();
    }

    /// The next scheduled instant of `sj` (None: none, or suspended).
    pub fn next_run(&self, sj: &SingletonJob, next: Option<Timestamp>) {
        let next = next.filter(|_| !sj.spec.suspend.unwrap_or(false));
        let mut map = crate::sync::lock(&self.next_runs.0);
        match next {
            Some(t) => map.insert(job(sj), t),
            None => map.remove(&job(sj)),
        };
    }

    // --- Fencing ----------------------------------------------------------------------------

    /// A write of the run path failed: counts a refusal (409, or the gate closed).
    pub fn write_refused(&self, sj: &SingletonJob, err: &Error) {
        if matches!(err, Error::Conflict(_) | Error::NotLeader) {
            self.stale_writes_refused
                .get_or_create(&self.source(sj, "controller"))
                .inc();
        }
    }

    /// The backstop's count of stale tokens refused by workloads, as read from it. The database's
    /// counter never decreases and survives controller restarts, so it is exported as the
    /// counter's value (not added to it): a restarted controller continues the same series.
    pub fn rejections(&self, sj: &SingletonJob, total: u64) {
        if total > 0 {
            self.stale_writes_refused
                .get_or_create(&self.source(sj, "workload"))
                .inner()
                .fetch_max(total, Ordering::Relaxed);
        }
    }

    // --- Backstop, clock, reconcile -----------------------------------------------------------

    /// One backstop operation (`what` as the backstop names it, e.g. "read fence") ended.
    pub fn backstop_op(&self, what: &str, took: Duration, err: Option<&Error>) {
        let op = what.replace(' ', "_");
        self.backstop_operation_seconds
            .get_or_create(&OpLabels { op: op.clone() })
            .observe(took.as_secs_f64());
        if let Some(e) = err {
            self.backstop_errors
                .get_or_create(&OpErrorLabels {
                    op,
                    kind: e.kind().into(),
                })
                .inc();
        }
    }

    /// A reconcile of `sj` was put off: its namespace's database time in flight was spent
    /// (issue 34, N3).
    pub fn backstop_deferred(&self, sj: &SingletonJob) {
        self.backstop_deferred.get_or_create(&self.job(sj)).inc();
    }

    pub fn clock_offset(&self, offset: Option<SignedDuration>) {
        if let Some(o) = offset {
            self.clock_offset_seconds.set(o.as_secs_f64());
        }
    }

    /// Observes the reconcile's duration when dropped.
    pub fn reconcile_timer(&self) -> ReconcileTimer<'_> {
        ReconcileTimer {
            histogram: &self.reconcile_duration_seconds,
            start: std::time::Instant::now(),
        }
    }

    /// Whether `sj` is a SingletonJob the controller cannot decode ([`crate::watch_decode`]).
    pub fn undecodable(&self, sj: &SingletonJob, undecodable: bool) {
        if undecodable {
            self.undecodable.get_or_create(&job(sj)).set(1);
        } else {
            self.undecodable.remove(&job(sj));
        }
    }

    pub fn reconcile_error(&self, err: &Error) {
        self.reconcile_errors
            .get_or_create(&KindLabels {
                kind: err.kind().into(),
            })
            .inc();
    }

    /// A deleted SingletonJob: every series labelled with it goes, so a namespace's churn of
    /// SingletonJobs does not grow `/metrics` for ever (a re-created one starts its counters
    /// from zero, which Prometheus' `rate` reads as a counter reset).
    pub fn forget(&self, sj: &SingletonJob) {
        self.forget_labels(job(sj));
    }

    fn forget_labels(&self, key: JobLabels) {
        let reasons = crate::sync::lock(&self.series).remove(&key);
        crate::sync::lock(&self.next_runs.0).remove(&key);
        self.undecodable.remove(&key);
        for family in [
            &self.runs_started,
            &self.claims_conflicted,
            &self.claims_deduplicated,
            &self.runs_late,
            &self.suspended_after_failures,
            &self.tokens_issued,
            &self.backstop_deferred,
        ] {
            family.remove(&key);
        }
        let JobLabels { namespace, name } = key;
        for outcome in [Outcome::Succeeded, Outcome::Failed, Outcome::Replaced] {
            self.runs_finished.remove(&OutcomeLabels {
                namespace: namespace.clone(),
                name: name.clone(),
                outcome: outcome.name().to_string(),
            });
        }
        for result in NotifyResult::ALL {
            self.notifications.remove(&NotifyLabels {
                namespace: namespace.clone(),
                name: name.clone(),
                result: result.name().to_string(),
            });
        }
        for stage in PreparedStage::ALL {
            self.prepared_runs.remove(&StageLabels {
                namespace: namespace.clone(),
                name: name.clone(),
                stage: stage.name().to_string(),
            });
        }
        for source in ["controller", "workload"] {
            self.stale_writes_refused.remove(&SourceLabels {
                namespace: namespace.clone(),
                name: name.clone(),
                source: source.into(),
            });
        }
        for reason in reasons.into_iter().flatten() {
            let labels = ReasonLabels {
                namespace: namespace.clone(),
                name: name.clone(),
                reason,
            };
            self.periods_missed.remove(&labels);
            self.periods_skipped.remove(&labels);
            self.runs_withdrawn.remove(&labels);
        }
    }

    /// Forgets every SingletonJob with a series that is not in `live` (namespace, name): the
    /// ones deleted while the watch was down.
    pub fn forget_all_but(&self, live: &std::collections::HashSet<(String, String)>) {
        let gone: Vec<JobLabels> = crate::sync::lock(&self.series)
            .keys()
            .chain(crate::sync::lock(&self.next_runs.0).keys())
            .filter(|k| !live.contains(&(k.namespace.clone(), k.name.clone())))
            .cloned()
            .collect();
        for k in gone {
            self.forget_labels(k);
        }
    }

    /// The labels of `sj`, noted as having series.
    fn job(&self, sj: &SingletonJob) -> JobLabels {
        let key = job(sj);
        crate::sync::lock(&self.series)
            .entry(key.clone())
            .or_default();
        key
    }

    fn source(&self, sj: &SingletonJob, source: &str) -> SourceLabels {
        let JobLabels { namespace, name } = self.job(sj);
        SourceLabels {
            namespace,
            name,
            source: source.into(),
        }
    }
}

/// See [`Metrics::reconcile_timer`].
pub struct ReconcileTimer<'a> {
    histogram: &'a Histogram,
    start: std::time::Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}

fn job(sj: &SingletonJob) -> JobLabels {
    JobLabels {
        namespace: sj.metadata.namespace.clone().unwrap_or_default(),
        name: sj.metadata.name.clone().unwrap_or_default(),
    }
}

/// `singleton_next_run_seconds{namespace,name}`: the time until each SingletonJob's next
/// scheduled instant, computed at scrape time from the instant the last reconcile found (a gauge
/// set at reconcile time would stand still between reconciles). Negative: the instant has passed
/// and no reconcile has decided it yet.
#[derive(Debug, Default)]
struct NextRuns(Mutex<HashMap<JobLabels, Timestamp>>);

impl Collector for NextRuns {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let map = crate::sync::lock(&self.0);
        if map.is_empty() {
            return Ok(());
        }
        let now = Timestamp::now();
        let mut family: MetricEncoder = encoder.encode_descriptor(
            "next_run",
            "Time until the next scheduled instant of each SingletonJob (not suspended)",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        for (labels, at) in map.iter() {
            let secs = at.duration_since(now).as_secs_f64();
            ConstGauge::new(secs).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sj(ns: &str, name: &str) -> SingletonJob {
        let mut sj = SingletonJob::new(
            name,
            serde_yaml::from_str(
                "schedule: '* * * * *'\njobTemplate: {spec: {template: {spec: {containers: []}}}}",
            )
            .unwrap(),
        );
        sj.metadata.namespace = Some(ns.into());
        sj
    }

    /// Touches every metric once, so every family has a series to render.
    fn touched() -> Metrics {
        let m = Metrics::new();
        let a = sj("ns", "a");
        m.started_leading(Instant::now());
        m.stopped_leading();
        m.leader.set(1);
        m.leader_epoch.set(3);
        m.lease_renew_failures.inc();
        m.acquire_attempt_failed("Contention");
        m.multi_cluster_claim("east", "TookOver");
        m.token_issued(&a);
        m.run_withdrawn(&a, "Suspended");
        m.prepared(&a, PreparedStage::Prepared);
        m.prepare_lead(SignedDuration::from_secs(57));
        m.backstop_deferred(&a);
        m.claim_failed(&a, &Error::Conflict("x".into()));
        let period: Timestamp = "2027-01-01T00:00:00Z".parse().unwrap();
        m.run_started(&a, period, period + SignedDuration::from_millis(1500));
        let entry = |outcome, reason: &str, count| HistoryEntry {
            unknown: Default::default(),
            late: false,
            period: period.into(),
            last_period: None,
            count,
            outcome,
            reason: Some(reason.into()),
            job_name: None,
            token: None,
            start_time: None,
            finish_time: None,
            requested_by: None,
            cluster: None,
            message: None,
        };
        m.recorded(&a, &entry(Outcome::Succeeded, "", 1));
        m.recorded(
            &a,
            &entry(Outcome::Missed, crate::decide::reason::DEADLINE_EXCEEDED, 4),
        );
        m.recorded(
            &a,
            &entry(Outcome::Skipped, crate::decide::reason::SUSPENDED, 2),
        );
        m.recorded(
            &a,
            &entry(
                Outcome::Deduplicated,
                crate::decide::reason::DEDUPLICATED,
                1,
            ),
        );
        m.runs_late.get_or_create(&job(&a)).inc();
        m.suspended_after_failures.get_or_create(&job(&a)).inc();
        m.next_run(&a, Some(Timestamp::now() + SignedDuration::from_secs(60)));
        m.write_refused(&a, &Error::NotLeader);
        m.notification("ns", "a", NotifyResult::GaveUp);
        m.backstop_op(
            "read fence",
            Duration::from_millis(3),
            Some(&Error::BackstopUnavailable("down".into())),
        );
        m.clock_offset(Some(SignedDuration::from_millis(-250)));
        drop(m.reconcile_timer());
        m.reconcile_error(&Error::NotLeader);
        m
    }

    #[test]
    fn a_deleted_singletonjobs_series_are_all_removed_and_others_stay() {
        let m = touched();
        let (a, b) = (sj("ns", "a"), sj("ns", "b"));
        m.rejections(&a, 7);
        m.token_issued(&b);
        m.next_run(&b, Some(Timestamp::now() + SignedDuration::from_secs(60)));
        assert!(m.render().contains(r#"name="a""#));
        m.forget(&a);
        let text = m.render();
        let left: Vec<&str> = text.lines().filter(|l| l.contains(r#"name="a""#)).collect();
        assert!(
            left.is_empty(),
            "series of the deleted SingletonJob: {left:#?}"
        );
        assert!(text.contains(r#"singleton_tokens_issued_total{namespace="ns",name="b"} 1"#));
        assert!(text.contains(r#"singleton_next_run_seconds{namespace="ns",name="b"}"#));
        // Deleted while the watch was down: the next full list leaves only the live ones.
        m.forget_all_but(&[("other".to_string(), "c".to_string())].into());
        assert!(!m.render().contains(r#"name="b""#));
    }

    #[test]
    fn the_registry_renders_every_metric_with_its_name_type_and_labels() {
        let text = touched().render();
        for (name, kind) in [
            ("singleton_leader", "gauge"),
            ("singleton_leader_epoch", "gauge"),
            ("singleton_leader_transitions", "counter"),
            ("singleton_lease_acquire_seconds", "histogram"),
            ("singleton_leader_hold_seconds", "histogram"),
            ("singleton_lease_renew_failures", "counter"),
            ("singleton_lease_acquire_attempts_failed", "counter"),
            ("singleton_runs_started", "counter"),
            ("singleton_runs_finished", "counter"),
            ("singleton_periods_missed", "counter"),
            ("singleton_periods_skipped", "counter"),
            ("singleton_claims_conflicted", "counter"),
            ("singleton_multicluster_claims", "counter"),
            ("singleton_claims_deduplicated", "counter"),
            ("singleton_runs_withdrawn", "counter"),
            ("singleton_prepared_runs", "counter"),
            ("singleton_prepare_lead_seconds", "gauge"),
            ("singleton_runs_late", "counter"),
            ("singleton_suspended_after_failures", "counter"),
            ("singleton_schedule_skew_seconds", "histogram"),
            ("singleton_next_run_seconds", "gauge"),
            ("singleton_tokens_issued", "counter"),
            ("singleton_stale_writes_refused", "counter"),
            ("singleton_notifications", "counter"),
            ("singleton_backstop_operation_seconds", "histogram"),
            ("singleton_backstop_errors", "counter"),
            ("singleton_backstop_deferred", "counter"),
            ("singleton_clock_offset_seconds", "gauge"),
            ("singleton_reconcile_duration_seconds", "histogram"),
            ("singleton_reconcile_errors", "counter"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} {kind} missing:\n{text}"
            );
        }
        for sample in [
            "singleton_leader 1\n",
            "singleton_leader_epoch 3\n",
            "singleton_leader_transitions_total 1\n",
            r#"singleton_lease_acquire_attempts_failed_total{reason="Contention"} 1"#,
            r#"singleton_runs_started_total{namespace="ns",name="a"} 1"#,
            r#"singleton_notifications_total{namespace="ns",name="a",result="GaveUp"} 1"#,
            r#"singleton_multicluster_claims_total{cluster="east",result="TookOver"} 1"#,
            r#"singleton_tokens_issued_total{namespace="ns",name="a"} 1"#,
            r#"singleton_claims_conflicted_total{namespace="ns",name="a"} 1"#,
            r#"singleton_runs_finished_total{namespace="ns",name="a",outcome="Succeeded"} 1"#,
            r#"singleton_periods_missed_total{namespace="ns",name="a",reason="DeadlineExceeded"} 4"#,
            r#"singleton_periods_skipped_total{namespace="ns",name="a",reason="Suspended"} 2"#,
            r#"singleton_claims_deduplicated_total{namespace="ns",name="a"} 1"#,
            r#"singleton_runs_late_total{namespace="ns",name="a"} 1"#,
            r#"singleton_suspended_after_failures_total{namespace="ns",name="a"} 1"#,
            r#"singleton_stale_writes_refused_total{namespace="ns",name="a",source="controller"} 1"#,
            r#"singleton_backstop_errors_total{op="read_fence",kind="BackstopUnavailable"} 1"#,
            r#"singleton_backstop_operation_seconds_count{op="read_fence"} 1"#,
            "singleton_clock_offset_seconds -0.25\n",
            "singleton_prepare_lead_seconds 57\n",
            "singleton_schedule_skew_seconds_count 1\n",
            "singleton_reconcile_duration_seconds_count 1\n",
            r#"singleton_reconcile_errors_total{kind="NotLeader"} 1"#,
            "singleton_leader_hold_seconds_count 1\n",
            "# UNIT singleton_schedule_skew_seconds seconds\n",
            "# EOF\n",
        ] {
            assert!(text.contains(sample), "{sample:?} missing:\n{text}");
        }
        let next = text
            .lines()
            .find(|l| l.starts_with(r#"singleton_next_run_seconds{namespace="ns",name="a"} "#))
            .unwrap_or_else(|| panic!("next_run missing:\n{text}"));
        let secs: f64 = next.rsplit(' ').next().unwrap().parse().unwrap();
        assert!((50.0..=60.0).contains(&secs), "{next}");
        // Skew of 1.5 s lands in the 2 s bucket, not the 1 s one.
        assert!(
            text.contains("singleton_schedule_skew_seconds_bucket{le=\"1.0\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("singleton_schedule_skew_seconds_bucket{le=\"2.0\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn the_skew_buckets_run_from_5_ms_to_512_s_and_include_cronjobs() {
        let text = touched().render();
        let les: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("singleton_schedule_skew_seconds_bucket{le=\""))
            .map(|l| l.split('"').nth(1).unwrap().to_string())
            .collect();
        let expected: Vec<String> = SKEW_BUCKETS
            .iter()
            .map(|b| format!("{b:?}"))
            .chain(["+Inf".to_string()])
            .collect();
        assert_eq!(les, expected);
        assert_eq!(SKEW_BUCKETS.first(), Some(&0.005));
        assert_eq!(SKEW_BUCKETS.last(), Some(&512.0));
        // CronJob's buckets are 1, 2, 4, ..., 512 (ExponentialBuckets(1, 2, 10)).
        for k in 0..10 {
            assert!(SKEW_BUCKETS.contains(&f64::from(1u32 << k)), "2^{k}");
        }
    }

    #[test]
    fn a_workload_series_keeps_the_databases_value_and_never_goes_down() {
        let m = Metrics::new();
        let labels = m.source(&sj("ns", "a"), "workload");
        let c = m.stale_writes_refused.get_or_create(&labels).clone();
        c.inner().fetch_max(5, Ordering::Relaxed);
        c.inner().fetch_max(3, Ordering::Relaxed);
        assert_eq!(c.get(), 5);
    }

    /// The alert expressions of docs/observability.md (```promql blocks) parse as PromQL.
    #[test]
    fn the_documented_alert_expressions_are_valid_promql() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/observability.md");
        let doc = std::fs::read_to_string(path).expect("docs/observability.md");
        let mut blocks = 0;
        let mut rest = doc.as_str();
        while let Some(start) = rest.find("```promql\n") {
            let body = &rest[start + "```promql\n".len()..];
            let end = body.find("```").expect("an unclosed promql block");
            let expr = body[..end].trim();
            promql_parser::parser::parse(expr)
                .unwrap_or_else(|e| panic!("invalid PromQL: {e}\n{expr}"));
            blocks += 1;
            rest = &body[end + 3..];
        }
        assert!(
            blocks >= 5,
            "expected at least the five alerts, found {blocks}"
        );
    }

    /// Words that look like our metric names, to catch a misspelt one.
    fn metric_names(expr: &str) -> Vec<&str> {
        expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("singleton_"))
            .collect()
    }

    #[test]
    fn the_documented_alerts_name_only_metrics_that_exist() {
        let text = touched().render();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/observability.md");
        let doc = std::fs::read_to_string(path).expect("docs/observability.md");
        for block in doc.split("```promql\n").skip(1) {
            let expr = block.split("```").next().unwrap_or_default();
            for name in metric_names(expr) {
                assert!(
                    text.lines()
                        .any(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' '])),
                    "{name} is not a rendered series\n{expr}"
                );
            }
        }
    }

    /// The chart ships what the docs explain: every rule of the PrometheusRule and every query of
    /// the Grafana dashboard is valid PromQL over metrics that exist, and the rules are exactly
    /// the documented alerts.
    #[test]
    fn the_charts_alert_rules_and_dashboard_are_valid_and_documented() {
        let text = touched().render();
        let exists = |name: &str| {
            text.lines()
                .any(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        };
        let chart = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../charts/singleton-controller/files"
        );
        let rules: Vec<serde_json::Value> =
            serde_yaml::from_str(&std::fs::read_to_string(format!("{chart}/alerts.yaml")).unwrap())
                .unwrap();
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/observability.md"
        ))
        .unwrap();
        let documented: Vec<&str> = doc
            .split("```promql\n")
            .skip(1)
            .map(|b| b.split("```").next().unwrap_or_default().trim())
            .collect();
        assert_eq!(
            rules.len(),
            documented.len(),
            "one rule per documented alert"
        );
        for rule in &rules {
            let expr = rule["expr"].as_str().expect("expr");
            promql_parser::parser::parse(expr).unwrap_or_else(|e| panic!("{e}: {expr}"));
            assert!(
                documented.contains(&expr),
                "not in docs/observability.md: {expr}"
            );
            for name in metric_names(expr) {
                assert!(exists(name), "{name} is not a rendered series");
            }
        }
        let dashboard: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(format!("{chart}/dashboard.json")).unwrap(),
        )
        .unwrap();
        let mut queries = 0;
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                promql_parser::parser::parse(expr).unwrap_or_else(|e| panic!("{e}: {expr}"));
                for name in metric_names(expr) {
                    assert!(exists(name), "dashboard: {name} is not a rendered series");
                }
                queries += 1;
            }
        }
        assert!(queries >= 10, "{queries} dashboard queries");
    }
}
