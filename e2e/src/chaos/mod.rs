//! The fault-injection suite (issues #8 and #16): each scenario starts a world (three replicas,
//! the real control plane, PostgreSQL, the kwok node, SingletonJobs every few seconds with the
//! backstop and history limits 0, a watch of their Jobs, a workload doing fenced writes), injects
//! one fault for a bounded time, lets it heal, and checks the external truth ([`check`]).
//! `CHAOS=full` (make chaos) runs each fault for about a minute; otherwise (make e2e) a short
//! window each.

pub mod check;
pub mod dr;
pub mod dr_check;
pub mod evidence;
pub mod mariadb;
pub mod outside;
pub mod prepared;
pub mod real;
pub mod real_pods;
pub mod world;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use jiff::{SignedDuration, Timestamp};
use singleton::decide::reason;

use check::{Expect, FaultWindow, Proof, Row};
use evidence::{PortProbe, Restart, StateSampler};
use mariadb::Db;
use world::{SjDef, World, cluster, default_sjs};

/// How long each phase lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `make e2e`: every scenario once, short fault windows.
    Short,
    /// `make chaos` (`CHAOS=full`): about a minute per scenario.
    Full,
}

impl Mode {
    pub fn from_env() -> Mode {
        match std::env::var("CHAOS").as_deref() {
            Ok("full") => Mode::Full,
            _ => Mode::Short,
        }
    }

    /// Steady state observed before the fault.
    fn steady(self) -> Duration {
        match self {
            Mode::Short => Duration::from_secs(2),
            Mode::Full => Duration::from_secs(8),
        }
    }

    /// How long a fault lasts (where its length is ours to choose).
    fn window(self) -> Duration {
        match self {
            Mode::Short => Duration::from_secs(7),
            Mode::Full => Duration::from_secs(30),
        }
    }

    /// Observed after recovery.
    fn settle(self) -> Duration {
        match self {
            Mode::Short => Duration::from_secs(3),
            Mode::Full => Duration::from_secs(10),
        }
    }

    /// How long apiserver-restart and etcd-restart keep their component stopped: the short form
    /// too keeps it down long enough for periods of both default schedules to fall due.
    fn outage(self) -> Duration {
        match self {
            Mode::Short => Duration::from_secs(4),
            Mode::Full => self.window(),
        }
    }

    /// leader-sigkill's kills.
    fn kills(self) -> usize {
        match self {
            Mode::Short => 2,
            Mode::Full => 5,
        }
    }

    /// rolling-sigterm's rounds (each replica once per round).
    fn rolling_rounds(self) -> usize {
        match self {
            Mode::Short => 1,
            Mode::Full => 3,
        }
    }

    /// status-wipe's rounds (a handover every second one).
    fn wipe_rounds(self) -> usize {
        match self {
            Mode::Short => 2,
            Mode::Full => 6,
        }
    }

    /// burst-pause: SingletonJobs in the burst, all due at one instant. The short form's half
    /// still has the leader paused mid-burst (a quarter created) and takes about 30 s less:
    /// completing and pruning the burst is paced by the job controller's 20 requests a second.
    fn burst_sjs(self) -> usize {
        match self {
            Mode::Short => 100,
            Mode::Full => 200,
        }
    }
}

/// The kwok rows' leader election ([`crate::FAST_ELECTION`]): lease duration and retry period.
const LEASE: Duration = Duration::from_secs(4);
const RETRY: Duration = Duration::from_millis(500);
/// On top of lease + retry: the takeover's API round trips and the suite's Lease polling (20 ms)
/// on two loaded cores. docs/reliability.md: "failover within lease + retry".
const FAILOVER_SLACK: Duration = Duration::from_millis(1500);
/// A graceful (SIGTERM) handover: "sub-second failover" (docs/reliability.md).
const HANDOVER_MAX: Duration = Duration::from_secs(1);
/// replace-hung-tx's least fault window: a claim stuck behind the lock can pass its 6 s
/// deadline (lock timeout 5 s, then a retry).
const HUNG_WINDOW: Duration = Duration::from_secs(16);

/// Reasons any outage or failover explains: catch-up after it (`catchUp: Latest` supersedes the
/// periods it missed; `catchUp: All` records those past their starting deadline).
pub(crate) const CATCH_UP: &[&str] = &[reason::SUPERSEDED, reason::DEADLINE_EXCEEDED];
/// The API server or etcd down: also a claimed period whose Job could not be created by its
/// deadline.
const API_DOWN: &[&str] = &[
    reason::SUPERSEDED,
    reason::DEADLINE_EXCEEDED,
    reason::JOB_NOT_CREATED,
];
/// PostgreSQL down under `lock.purpose: Correctness`: also periods that could not be claimed.
const DB_DOWN: &[&str] = &[
    reason::SUPERSEDED,
    reason::DEADLINE_EXCEEDED,
    reason::BACKSTOP_UNAVAILABLE,
];
/// A transaction hung on the fence row: also a claim that waited for it past its deadline.
const FENCE_HUNG: &[&str] = &[
    reason::SUPERSEDED,
    reason::DEADLINE_EXCEEDED,
    reason::FENCE_HELD,
];
/// A resumer outside the controller: also a period whose Job it started before the release
/// (stopped, decided Failed).
const STARTED_OUTSIDE: &[&str] = &[
    reason::SUPERSEDED,
    reason::DEADLINE_EXCEEDED,
    reason::STARTED_BEFORE_CONFIRM,
];
/// burst-pause: every SingletonJob of the burst must run its one period.
const NOTHING: &[&str] = &[];

/// How many instants of `sjs`' schedules a window of `planned` always holds, wherever it falls:
/// at least `floor(planned / interval)` each.
fn min_due(planned: Duration, sjs: &[SjDef]) -> u64 {
    sjs.iter()
        .map(|sj| {
            let interval = sj.interval();
            if interval.is_zero() {
                0
            } else {
                (planned.as_millis() / interval.as_millis()) as u64
            }
        })
        .sum()
}

/// One fault type per scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A fault of the two-cluster setup (issue 22): [`dr`].
    Dr(dr::DrFault),
    /// The leader SIGSTOPped longer than its lease (Kleppmann's diagram), then SIGCONT; the
    /// workload holds its tokens meanwhile.
    LeaderSigstop,
    /// SIGKILL of whichever replica leads, repeatedly.
    LeaderSigkill,
    /// SIGTERM of every replica in turn (a rolling restart).
    RollingSigterm,
    /// kube-apiserver stopped and started.
    ApiserverRestart,
    /// etcd SIGSTOPped, then SIGCONT.
    EtcdPause,
    /// etcd stopped and started.
    EtcdRestart,
    /// PostgreSQL (the backstop and the workload's database) stopped and started.
    PostgresStop,
    /// One replica's clock 40 s ahead (libfaketime), and it leads.
    ClockAhead,
    /// One replica's clock 40 s behind, and it leads.
    ClockBehind,
    /// The leader cut off from the API server (a stalled TCP proxy on loopback).
    Partition,
    /// The workload of a Replace SingletonJob paused past the Replace of its run.
    ReplacePause,
    /// 200 SingletonJobs (100 in the short form) due at the same instant; the leader
    /// SIGSTOPped in the middle of the burst, held while another replica completes it and
    /// pruning removes the Jobs, then SIGCONT.
    BurstPause,
    /// The running workload of a Replace SingletonJob hangs in its transaction holding the fence
    /// row when the next period falls due.
    ReplaceHungTx,
    /// [`Fault::LeaderSigstop`] with the MariaDB backstop (`spec.backstop.mysql`): the paused
    /// workload's writes, fenced in MariaDB, must be refused there.
    LeaderSigstopMariadb,
    /// [`Fault::ReplacePause`] with the MariaDB backstop.
    ReplacePauseMariadb,
    /// A SingletonJob's status wiped with `kubectl edit --subresource=status` while it runs.
    StatusWipe,
    /// Real pods ([`real`]): the chart's leader container frozen with the cgroup freezer past
    /// its Lease, then thawed.
    RealLeaderFreeze,
    /// Real pods: the leader's container killed through the CRI (`crictl stop -t 0`).
    RealContainerKill,
    /// Real pods: the leader's pod deleted.
    RealPodDelete,
    /// Real pods: a running workload container frozen past the Replace of its run, then
    /// thawed: its fenced write must be refused.
    RealWorkloadFreeze,
    /// Real pods ([`real_pods`]): a run's pod deleted while it works, its grace longer than the
    /// work: no replacement while it terminates, one attempt commits.
    RealPodDeleteWorking,
    /// Real pods: the second real node drained while a run's pod works there.
    RealNodeDrain,
    /// Real pods: the kubelet of the node where a run's pod works frozen past the node's
    /// eviction; the pod replaced on the other node; the old process, still running, refused.
    RealKubeletPartition,
    /// Something outside the controller (a queue admitting every Job, a tool, a person) clears
    /// `spec.suspend` on every suspended Job it sees ([`outside`]).
    QueueResumer,
    /// The replicas' link to PostgreSQL cut while a run works, until after it completed
    /// ([`outside`]): its outcome waits for its token's retirement.
    DbCutAtCompletion,
    /// One replica runs the previous release (`SINGLETON_PREVIOUS_RELEASE`, issue 36), the
    /// others this tree: the Lease handed back and forth between the releases, as in a rolling
    /// upgrade and a rollback.
    MixedVersions,
    /// Prepared runs (issue 33, [`prepared`]): the leader stopped right before sending a
    /// prepared run's resume, that resume held in the network, the leader stopped past its Lease
    /// and the next prepared run's instant; the first run's SingletonJob suspended meanwhile, its
    /// withdrawal caught right after the Job's mark, and the late resume delivered then.
    PreparedLeaderSigstop,
    /// Prepared runs: the leader SIGKILLed while a run is prepared, 4 s before its instant.
    PreparedLeaderSigkill,
    /// Prepared runs: `suspend`, the schedule and the template edited 1.0 s before prepared
    /// runs' instants, the leader's watches 2 s behind.
    EditBeforeInstant,
}

/// What a scenario shares with others while it runs ([`Fault::scope`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Its own namespace and replicas only (the shared API server sees its load).
    Namespace,
    /// It stops, pauses or floods what every test uses: the API server, etcd or PostgreSQL, or
    /// (burst-pause) the API server, job controller, scheduler and kwok's fake node with 100
    /// (short form) or 200 runs at once. Alone.
    Cluster,
    /// The real nodes' pods, containers and kubelets (it may drain or freeze node 2).
    RealNodes,
    /// The second control plane of e2e/src/multicluster.rs, which it stops and restarts.
    SecondCluster,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Namespace => "namespace",
            Scope::Cluster => "cluster",
            Scope::RealNodes => "real-nodes",
            Scope::SecondCluster => "second-cluster",
        }
    }
}

pub const SCENARIOS: &[Fault] = &[
    Fault::LeaderSigstop,
    Fault::LeaderSigkill,
    Fault::RollingSigterm,
    Fault::ApiserverRestart,
    Fault::EtcdPause,
    Fault::EtcdRestart,
    Fault::PostgresStop,
    Fault::ClockAhead,
    Fault::ClockBehind,
    Fault::Partition,
    Fault::ReplacePause,
    Fault::BurstPause,
    Fault::ReplaceHungTx,
    Fault::StatusWipe,
    Fault::RealLeaderFreeze,
    Fault::RealContainerKill,
    Fault::RealPodDelete,
    Fault::RealWorkloadFreeze,
    Fault::RealPodDeleteWorking,
    Fault::RealNodeDrain,
    Fault::RealKubeletPartition,
    // In this order the namespace-only ones split into CHAOS_SHARD=1/3, 2/3 and 3/3 of about
    // 2 to 2.5 min each (hack/e2e.sh starts them as lanes free up): leader-sigstop, clock-ahead,
    // replace-pause, queue-resumer, mixed-versions, prepared-leader-sigstop; leader-sigkill,
    // clock-behind, replace-hung-tx, the two MariaDB rows, prepared-leader-sigkill;
    // rolling-sigterm, partition, status-wipe, db-cut-at-completion (51 s alone),
    // edit-before-instant. Mind the shards' lengths when adding a row.
    Fault::QueueResumer,
    Fault::LeaderSigstopMariadb,
    Fault::DbCutAtCompletion,
    Fault::MixedVersions,
    Fault::ReplacePauseMariadb,
    // Last, one to each shard (3/3, 1/3, 2/3), about 30 s each: the prepared rows.
    Fault::EditBeforeInstant,
    Fault::PreparedLeaderSigstop,
    Fault::PreparedLeaderSigkill,
];

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::Dr(d) => d.name(),
            Fault::LeaderSigstop => "leader-sigstop",
            Fault::LeaderSigkill => "leader-sigkill",
            Fault::RollingSigterm => "rolling-sigterm",
            Fault::ApiserverRestart => "apiserver-restart",
            Fault::EtcdPause => "etcd-pause",
            Fault::EtcdRestart => "etcd-restart",
            Fault::PostgresStop => "postgres-stop",
            Fault::ClockAhead => "clock-ahead-40s",
            Fault::ClockBehind => "clock-behind-40s",
            Fault::Partition => "partition",
            Fault::ReplacePause => "replace-pause",
            Fault::BurstPause => "burst-pause",
            Fault::ReplaceHungTx => "replace-hung-tx",
            Fault::LeaderSigstopMariadb => "leader-sigstop-mariadb",
            Fault::ReplacePauseMariadb => "replace-pause-mariadb",
            Fault::StatusWipe => "status-wipe",
            Fault::RealLeaderFreeze => "real-leader-freeze",
            Fault::RealContainerKill => "real-container-kill",
            Fault::RealPodDelete => "real-pod-delete",
            Fault::RealWorkloadFreeze => "real-workload-freeze",
            Fault::RealPodDeleteWorking => "real-pod-delete-working",
            Fault::RealNodeDrain => "real-node-drain",
            Fault::RealKubeletPartition => "real-kubelet-partition",
            Fault::QueueResumer => "queue-resumer",
            Fault::DbCutAtCompletion => "db-cut-at-completion",
            Fault::MixedVersions => "mixed-versions",
            Fault::PreparedLeaderSigstop => "prepared-leader-sigstop",
            Fault::PreparedLeaderSigkill => "prepared-leader-sigkill",
            Fault::EditBeforeInstant => "edit-before-instant",
        }
    }

    /// What else the scenario touches, so that scenarios of disjoint scopes can run side by
    /// side (`make e2e`, hack/e2e.sh).
    pub fn scope(self) -> Scope {
        match self {
            Fault::ApiserverRestart
            | Fault::EtcdPause
            | Fault::EtcdRestart
            | Fault::PostgresStop => Scope::Cluster,
            // Its 200 pods (then) queued in kwok (4 stage workers for every namespace) for about
            // 45 s: beside it, another row's runs stayed Running that long, an Allow job reached
            // its 10 active runs and its periods fell past their deadline (CI, 2026-12-05).
            Fault::BurstPause => Scope::Cluster,
            Fault::Dr(_) => Scope::SecondCluster,
            f if f.on_real_node() => Scope::RealNodes,
            _ => Scope::Namespace,
        }
    }

    /// The database of the row's backstop and workload: MariaDB for the `*-mariadb` rows.
    pub fn db(self) -> Db {
        match self {
            Fault::LeaderSigstopMariadb | Fault::ReplacePauseMariadb => Db::Mariadb,
            _ => Db::Postgres,
        }
    }

    /// The PostgreSQL row a MariaDB row repeats (the fault, its SingletonJobs and what it must
    /// show); every other row itself.
    fn base(self) -> Fault {
        match self {
            Fault::LeaderSigstopMariadb => Fault::LeaderSigstop,
            Fault::ReplacePauseMariadb => Fault::ReplacePause,
            f => f,
        }
    }

    /// Whether the scenario is one of the prepared-run rows ([`prepared`]), which run their own
    /// course.
    pub fn prepared(self) -> bool {
        matches!(
            self,
            Fault::PreparedLeaderSigstop | Fault::PreparedLeaderSigkill | Fault::EditBeforeInstant
        )
    }

    /// Whether the scenario runs on the real node's pods ([`real`]) rather than local replicas.
    pub fn on_real_node(self) -> bool {
        matches!(
            self,
            Fault::RealLeaderFreeze
                | Fault::RealContainerKill
                | Fault::RealPodDelete
                | Fault::RealWorkloadFreeze
                | Fault::RealPodDeleteWorking
                | Fault::RealNodeDrain
                | Fault::RealKubeletPartition
        )
    }

    /// What the scenario must show beyond the common checks, in `mode`: the reasons its fault
    /// may make the controller record a period, how many periods must fall due while it is on
    /// (what its planned duration guarantees for its schedules), the failover bound the
    /// documentation promises (docs/reliability.md) and how many failovers it causes.
    pub fn expect(self, mode: Mode) -> Expect {
        if let Fault::Dr(d) = self {
            return d.expect(mode);
        }
        if self.on_real_node() {
            return real::expect(self, mode);
        }
        if self.prepared() {
            return prepared::expect(self, mode);
        }
        if self.base() != self {
            return self.base().expect(mode);
        }
        let lease = Some(LEASE + RETRY + FAILOVER_SLACK);
        let (reasons, failover_max, min_failovers) = match self {
            Fault::LeaderSigstop | Fault::Partition => (CATCH_UP, lease, 1),
            Fault::LeaderSigkill => (CATCH_UP, lease, mode.kills()),
            Fault::RollingSigterm => (CATCH_UP, Some(HANDOVER_MAX), mode.rolling_rounds()),
            Fault::MixedVersions => (CATCH_UP, None, 2 * mode.kills()),
            Fault::ApiserverRestart | Fault::EtcdPause | Fault::EtcdRestart => (API_DOWN, None, 0),
            Fault::PostgresStop | Fault::DbCutAtCompletion => (DB_DOWN, None, 0),
            Fault::QueueResumer => (STARTED_OUTSIDE, None, 0),
            Fault::ClockAhead | Fault::ClockBehind => (CATCH_UP, None, 1),
            Fault::ReplacePause => (CATCH_UP, None, 0),
            Fault::BurstPause => (NOTHING, None, 1),
            Fault::ReplaceHungTx => (FENCE_HUNG, None, 0),
            Fault::StatusWipe => (CATCH_UP, None, mode.wipe_rounds() / 2),
            _ => (CATCH_UP, None, 0),
        };
        Expect {
            // The workload holds tokens past a newer run: it must see refusals.
            pause: matches!(self, Fault::LeaderSigstop | Fault::ReplacePause),
            // A hung transaction is ended by the Replace (its Job deleted, its pod dead), so the
            // claim never waits out the backstop's lock timeout.
            no_backstop_missed: self == Fault::ReplaceHungTx,
            hung_replace: self == Fault::ReplaceHungTx,
            outside_starts: self == Fault::QueueResumer,
            reasons,
            min_due_in_fault: min_due(self.planned(mode), &self.sjs()),
            failover_max,
            min_failovers,
        }
    }

    /// The least time the fault is on, as the harness injects it in `mode` (zero where the fault
    /// takes as long as it takes).
    fn planned(self, mode: Mode) -> Duration {
        let window = mode.window();
        match self.base() {
            Fault::LeaderSigkill => (window / mode.kills() as u32) * mode.kills() as u32,
            Fault::RollingSigterm | Fault::BurstPause => Duration::ZERO,
            Fault::ApiserverRestart | Fault::EtcdRestart => mode.outage(),
            Fault::ReplaceHungTx => window.max(HUNG_WINDOW),
            Fault::StatusWipe => (window / mode.wipe_rounds() as u32) * mode.wipe_rounds() as u32,
            _ => window,
        }
    }

    fn sjs(self) -> Vec<SjDef> {
        let tick = || default_sjs().remove(0);
        match self.base() {
            Fault::ReplacePause => vec![
                tick(),
                SjDef::new("swap", "*/2 * * * * *")
                    .extra("  concurrencyPolicy: Replace\n")
                    .never_scheduled(),
            ],
            // Runs stay active (no node), so each period replaces the last; the deadline lets a
            // claim stuck behind the hung transaction be recorded Missed within the scenario.
            Fault::ReplaceHungTx => vec![
                tick(),
                SjDef::new("hang", "*/4 * * * * *")
                    .extra("  concurrencyPolicy: Replace\n  startingDeadlineSeconds: 6\n")
                    .never_scheduled(),
            ],
            // `wipe` has the backstop and keeps no Job; `kept` has no backstop, so only the Jobs
            // it keeps (default history limits) can tell the controller what ran. `wipe` is
            // wiped when no Job of it is left to show a token or period: it prepares no run
            // (a prepared run's Job, created at the previous instant, always shows the next
            // token); `kept` prepares its runs (on by default), so a wipe meets them too.
            Fault::StatusWipe => vec![
                SjDef::new("wipe", "*/5 * * * * *").extra("  prepareLeadSeconds: 0\n"),
                SjDef::new("kept", "*/2 * * * * *")
                    .backstop(false)
                    .keep_history(),
            ],
            _ => default_sjs(),
        }
    }
}

/// status-wipe: how long a round waits for the state it wipes in (`wipe`'s newest Job pruned,
/// a run of `kept` active).
const PRECONDITION_WAIT: Duration = Duration::from_secs(30);

/// Of the burst's SingletonJobs ([`Mode::burst_sjs`]), how many have the backstop. The
/// controller holds a connection per SingletonJob with one, and a paused leader keeps its
/// connections while the next opens its own: 200 each would be 400 against PostgreSQL's default
/// of 100. The rest rely on the Kubernetes layers alone.
const BURST_BACKSTOPPED: usize = 32;
/// From creating the SingletonJobs to the burst: time for the leader's first reconcile of each.
const BURST_LEAD: SignedDuration = SignedDuration::from_secs(40);

/// A scenario's row and what it violated (empty: passed).
pub struct Outcome {
    pub row: Row,
    pub violations: Vec<String>,
    pub took: Duration,
}

/// What injecting a fault measured: the failovers it caused, the evidence that it fired, notes
/// for the reader, and when the fault itself began (after any preparation, such as handing the
/// Lease to the replica to be faulted).
#[derive(Default)]
struct Injected {
    failovers: Vec<Duration>,
    proofs: Vec<Proof>,
    notes: Vec<String>,
    from: Option<Timestamp>,
}

/// Runs one scenario end to end.
pub async fn run_scenario(fault: Fault, mode: Mode) -> Result<Outcome> {
    if let Fault::Dr(d) = fault {
        return dr::run(d, mode).await;
    }
    if fault == Fault::BurstPause {
        return run_burst(mode).await;
    }
    if fault.on_real_node() {
        return real::run(fault, mode).await;
    }
    if fault.prepared() {
        return prepared::run(fault, mode).await;
    }
    let began = Instant::now();
    let mut w = start_world(fault).await?;
    let from = Timestamp::now();
    w.run_for(mode.steady()).await?;

    let injecting = Timestamp::now();
    let inj = match inject(&mut w, fault, mode).await {
        Ok(f) => f,
        Err(e) => {
            // Leave the cluster whole for the next scenario (and the other tests).
            heal_all().await;
            return Err(e.context(format!("injecting {}", fault.name())));
        }
    };
    let healed = Timestamp::now();
    let fault_from = inj.from.unwrap_or(injecting);
    // Not recovering is a finding, not an abort: the row still shows what happened.
    let mut unrecovered = None;
    let recovered = match w
        .wait(
            "every SingletonJob running again after the fault",
            Duration::from_secs(120),
            |w| Box::pin(async move { Ok(w.recovered_since(healed).await?.then_some(())) }),
        )
        .await
    {
        Ok(()) => Some(Timestamp::now()),
        Err(e) => {
            eprintln!("chaos: {}: {e:#}", fault.name());
            unrecovered =
                Some("not every SingletonJob ran again within 120 s of the fault".to_string());
            None
        }
    };
    let to = settle(&mut w, mode).await?;
    let mut obs = w.observe(from, to).await?;
    obs.failovers = inj.failovers;
    obs.fault = Some(FaultWindow {
        from: fault_from,
        to: healed,
        recovered,
    });
    obs.settle = mode.settle();
    obs.proofs = inj.proofs;
    obs.proofs.extend(workload_proofs(fault, &obs));
    let expect = fault.expect(mode);
    let fault_window = healed.duration_since(fault_from).unsigned_abs();
    let mut row = check::evaluate(fault.name(), fault_window, &expect, &obs);
    row.notes.extend(inj.notes);
    row.details.extend(unrecovered);
    finish(&w, row, expect, began).await
}

/// The world of one of [`run_scenario`]'s rows, started as its fault needs it, once it has a
/// leader and every SingletonJob has run a first time.
async fn start_world(fault: Fault) -> Result<World> {
    let proxied = (fault == Fault::Partition).then_some(0);
    let name = format!("chaos-{}", fault.name());
    let mut w = match fault {
        Fault::DbCutAtCompletion => World::start_with_db_link(&name, fault.sjs()).await?,
        Fault::MixedVersions => {
            World::start_mixed(&name, fault.sjs(), &previous_release()?, &[OLDER_SLOT]).await?
        }
        _ if fault.db() != Db::Postgres => World::start_on(&name, fault.sjs(), fault.db()).await?,
        _ => World::start(&name, fault.sjs(), proxied).await?,
    };
    w.wait_leader(None, Instant::now(), Duration::from_secs(60))
        .await?;
    w.wait(
        "a first run of every SingletonJob",
        Duration::from_secs(60),
        |w| Box::pin(async move { Ok(w.recovered_since(Timestamp::MIN).await?.then_some(())) }),
    )
    .await?;
    Ok(w)
}

/// The evidence the workload itself gives of a row's fault: writes held past a newer run (the
/// paused client), transactions hung holding the fence row.
fn workload_proofs(fault: Fault, obs: &check::Observations) -> Vec<Proof> {
    match fault.base() {
        Fault::LeaderSigstop | Fault::ReplacePause => {
            let held = obs.writes.iter().filter(|w| w.held).count();
            vec![Proof::new(
                held > 0,
                format!(
                    "the paused workload wrote {held} time(s) with a token held past a newer run"
                ),
            )]
        }
        Fault::ReplaceHungTx => vec![Proof::new(
            !obs.hung.is_empty(),
            format!(
                "{} workload transaction(s) hung holding the fence row",
                obs.hung.len()
            ),
        )],
        _ => Vec::new(),
    }
}

/// The row's verdict; on failure, what the cluster and the watch last showed.
async fn finish(w: &World, row: Row, expect: Expect, began: Instant) -> Result<Outcome> {
    Ok(Outcome::judge(row, expect, began, w.dump()).await)
}

impl Outcome {
    /// Judges `row`; on failure prints `dump` (what the world last showed) under its name.
    pub(crate) async fn judge(
        row: Row,
        expect: Expect,
        began: Instant,
        dump: impl std::future::Future<Output = String>,
    ) -> Outcome {
        let violations = row.violations(expect);
        if !violations.is_empty() {
            eprintln!("==== {} failed ====\n{}", row.scenario, dump.await);
        }
        Outcome {
            row,
            violations,
            took: began.elapsed(),
        }
    }
}

/// burst-pause: a burst of [`Mode::burst_sjs`] runs due at one instant (history limits 0,
/// Forbid); the leader SIGSTOPped once some but not all of the burst's Jobs exist, held past its
/// lease while another replica completes the burst and pruning removes the Jobs, then SIGCONT.
/// A resumed leader that sends what it had in flight (a Job create) re-creates a pruned run.
///
/// Its preconditions are proofs the row requires, not notes: the pause came in the middle of the
/// burst, the burst was completed and pruned while the leader was paused, the leader was still
/// stopped when it was resumed, and it exited after (so whatever it had in flight was sent
/// before the check). Its fault window runs from the burst's instant (the pause interrupts the
/// runs of that instant) to the resume.
async fn run_burst(mode: Mode) -> Result<Outcome> {
    let began = Instant::now();
    let lease_wait = Duration::from_secs(60);
    let burst = mode.burst_sjs();
    let (mut w, at) = start_burst(burst, lease_wait).await?;
    let (leader, idx, t0, pause_proof) = pause_mid_burst(&mut w, at, burst).await?;
    let mut proofs = vec![pause_proof];
    let (_, took) = match w.wait_leader(Some(leader), t0, lease_wait).await {
        Ok(l) => l,
        Err(e) => {
            w.signal(leader, "CONT").await?;
            return Err(e);
        }
    };
    let failovers = vec![took];
    proofs.push(completed_while_paused(&mut w, at, burst).await?);
    w.run_for(mode.window().saturating_sub(t0.elapsed()))
        .await?;
    let (resumed, fault_window) = resume_leader(&mut w, leader, idx, t0, &mut proofs).await?;
    w.run_for(mode.settle()).await?;
    let mut obs = w.observe(at - SignedDuration::from_secs(1), at).await?;
    obs.failovers = failovers;
    obs.fault = Some(FaultWindow {
        from: at,
        to: resumed,
        recovered: None,
    });
    obs.settle = mode.settle();
    obs.proofs = proofs;
    let expect = Fault::BurstPause.expect(mode);
    let row = check::evaluate(Fault::BurstPause.name(), fault_window, &expect, &obs);
    finish(&w, row, expect, began).await
}

/// burst-pause's world: `burst` SingletonJobs all scheduled for one instant, returned with it,
/// at least 2 s ahead.
async fn start_burst(burst: usize, lease_wait: Duration) -> Result<(World, Timestamp)> {
    let mut w = World::empty("chaos-burst-pause", None, false).await?;
    w.wait_leader(None, Instant::now(), lease_wait).await?;
    // An hourly schedule at a whole second: the burst comes once in the scenario.
    let at = Timestamp::from_second((Timestamp::now() + BURST_LEAD).as_second())?;
    let z = at.to_zoned(jiff::tz::TimeZone::UTC);
    let schedule = format!("{} {} * * * *", z.second(), z.minute());
    let sjs = (0..burst)
        .map(|i| SjDef::new(format!("b-{i:03}"), schedule.clone()).backstop(i < BURST_BACKSTOPPED))
        .collect();
    w.add_sjs(sjs).await?;
    wait_scheduled(&mut w, at, burst).await?;
    let ready = Timestamp::now();
    if ready + SignedDuration::from_secs(2) > at {
        anyhow::bail!(
            "setting up {burst} SingletonJobs took until {ready}, too close to the burst at {at}: raise BURST_LEAD"
        );
    }
    Ok((w, at))
}

/// Waits (at most 60 s) until all `burst` SingletonJobs show `at` as their next schedule time.
async fn wait_scheduled(w: &mut World, at: Timestamp, burst: usize) -> Result<()> {
    let next = singleton::naming::period_rfc3339(at);
    w.wait(
        "every SingletonJob of the burst scheduled",
        Duration::from_secs(60),
        |w| {
            let next = next.clone();
            Box::pin(async move {
                let list = w.env.sjs().list(&Default::default()).await?;
                let n = list
                    .items
                    .iter()
                    .filter(|sj| {
                        sj.status
                            .as_ref()
                            .and_then(|s| s.next_schedule_time.as_deref())
                            == Some(next.as_str())
                    })
                    .count();
                Ok((n == burst).then_some(()))
            })
        },
    )
    .await
}

/// Whether a Job is of the burst at `at`.
fn of_burst(at: Timestamp) -> impl Fn(&crate::observer::JobRecord) -> bool + Copy {
    move |j: &crate::observer::JobRecord| j.period == Some(at)
}

/// SIGSTOPs the leader once a quarter of the burst's Jobs exist: (its slot, its process, when
/// it was stopped, the proof that the pause came before the burst was complete).
async fn pause_mid_burst(
    w: &mut World,
    at: Timestamp,
    burst: usize,
) -> Result<(usize, usize, Instant, Proof)> {
    // Mid-burst: a quarter of the burst's Jobs exist. Polled every 10 ms from the watch.
    let of_burst = of_burst(at);
    let quarter = burst / 4;
    let wait_burst = at.duration_since(Timestamp::now()).unsigned_abs() + Duration::from_secs(60);
    if !w
        .wait_jobs(wait_burst, Duration::from_millis(10), |jobs| {
            jobs.iter().filter(|j| of_burst(j)).count() >= quarter
        })
        .await?
    {
        anyhow::bail!(
            "the burst at {at} never reached {quarter} Jobs\n{}",
            w.dump().await
        );
    }
    let leader = match w.leader().await? {
        Some(l) => l,
        None => anyhow::bail!(
            "nobody leads in the middle of the burst\n{}",
            w.dump().await
        ),
    };
    let idx = w.process(leader);
    w.signal(leader, "STOP").await?;
    let t0 = Instant::now();
    let at_pause = w.observer.jobs().iter().filter(|j| of_burst(j)).count();
    let proof = Proof::new(
        at_pause < burst,
        format!("the leader was paused with {at_pause} of the burst's {burst} Jobs created"),
    );
    Ok((leader, idx, t0, proof))
}

/// Held while another replica completes the burst and pruning removes every Job of it (at most
/// 150 s): the proof that it did.
async fn completed_while_paused(w: &mut World, at: Timestamp, burst: usize) -> Result<Proof> {
    let of_burst = of_burst(at);
    let done = w
        .wait_jobs(
            Duration::from_secs(150),
            Duration::from_millis(200),
            |jobs| {
                let ran: HashSet<&str> = jobs
                    .iter()
                    .filter(|j| of_burst(j) && j.ran)
                    .filter_map(|j| j.sj.as_deref())
                    .collect();
                ran.len() == burst
                    && jobs
                        .iter()
                        .filter(|j| of_burst(j))
                        .all(|j| j.deleted.is_some())
            },
        )
        .await?;
    let left = w
        .observer
        .jobs()
        .iter()
        .filter(|j| of_burst(j) && j.deleted.is_none())
        .count();
    Ok(Proof::new(
        done,
        format!(
            "while the leader was paused another replica completed the burst and pruning removed its Jobs ({left} left)"
        ),
    ))
}

/// SIGCONTs the paused leader, proving it was still stopped then, and waits (at most 30 s) for
/// it to exit, proving that too: when it was resumed, and the fault window from `t0` to then.
async fn resume_leader(
    w: &mut World,
    leader: usize,
    idx: usize,
    t0: Instant,
    proofs: &mut Vec<Proof>,
) -> Result<(Timestamp, Duration)> {
    let still = w.process(leader) == idx && w.env.controller_stopped(idx);
    proofs.push(Proof::new(
        still,
        format!("the paused leader (process {idx}) was still stopped when it was resumed"),
    ));
    w.signal(leader, "CONT").await?;
    let resumed = Timestamp::now();
    let fault_window = t0.elapsed();
    // The resumed leader finds its Lease lost and exits; whatever it had in flight is sent by then.
    let exited = w
        .wait("the resumed leader's exit", Duration::from_secs(30), |w| {
            Box::pin(async move { Ok(w.exited(leader, idx).then_some(())) })
        })
        .await
        .is_ok();
    proofs.push(Proof::new(
        exited,
        "the resumed leader exited within 30 s (what it had in flight was sent before the check)",
    ));
    Ok((resumed, fault_window))
}

/// mixed-versions: the replica that runs the previous release.
const OLDER_SLOT: usize = 1;

/// The previous release's controller build (hack/previous-release.sh, which `make e2e` runs).
fn previous_release() -> Result<std::path::PathBuf> {
    let dir = std::env::var_os("SINGLETON_PREVIOUS_RELEASE").context(
        "mixed-versions needs SINGLETON_PREVIOUS_RELEASE: `make e2e` sets it (hack/previous-release.sh build prints it)",
    )?;
    let bin = std::path::Path::new(&dir).join("singleton-controller");
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: rebuild it with hack/previous-release.sh build",
        bin.display()
    );
    Ok(bin)
}

/// mixed-versions: the Lease handed to the older replica and back, `rounds` times each way
/// (make_leader: a handover only the target can win), by SIGTERM and SIGKILL of the leader in
/// turn (a rolling update; a crash, the Lease left to expire), running for an equal share of
/// the window after each. Proves each handover crossed releases.
async fn alternate_releases(w: &mut World, mode: Mode, inj: &mut Injected) -> Result<()> {
    let rounds = mode.kills();
    let share = mode.window() / (2 * rounds) as u32;
    let (mut to_older, mut to_newer) = (0, 0);
    inj.from = Some(Timestamp::now());
    // Away from the release that leads now, first.
    let mut older_next = w.leader().await? != Some(OLDER_SLOT);
    let (mut termed, mut killed) = (0, 0);
    for k in 0..2 * rounds {
        let target = if older_next { OLDER_SLOT } else { 0 };
        let signal = if k % 2 == 0 { "TERM" } else { "KILL" };
        let t0 = Instant::now();
        if w.make_leader_by(target, 3, signal).await? {
            match signal {
                "TERM" => termed += 1,
                _ => killed += 1,
            }
            inj.failovers.push(t0.elapsed());
            match older_next {
                true => to_older += 1,
                false => to_newer += 1,
            }
        }
        older_next = !older_next;
        w.run_for(share).await?;
    }
    inj.proofs.push(Proof::new(
        to_older >= rounds && to_newer >= rounds && killed >= rounds / 2,
        format!(
            "the Lease passed from this tree's replicas to the previous release's {to_older} times and back {to_newer} times (at least {rounds} each); {termed} leaders SIGTERMed, {killed} SIGKILLed"
        ),
    ));
    inj.notes.push(format!(
        "replica {OLDER_SLOT} ran {}",
        w.build_of(OLDER_SLOT).display()
    ));
    Ok(())
}

/// The most a row waits, after its settle time, for the controller to decide every period due by
/// the check: catchUp All replays each period an outage missed, a few seconds each on two loaded
/// cores. A period still undecided after this counts as lost once older than the pending bound.
const CATCH_UP_WAIT: Duration = Duration::from_secs(30);

/// Observes the row's settle time after recovery, then until every SingletonJob has decided the
/// periods due by the check's end (4 s before now), at most [`CATCH_UP_WAIT`]; returns that end. The
/// checker then judges a settled state instead of a snapshot taken mid catch-up.
async fn settle(w: &mut World, mode: Mode) -> Result<Timestamp> {
    w.run_for(mode.settle()).await?;
    let to = Timestamp::now() - SignedDuration::from_secs(4);
    let began = Instant::now();
    // A failed read of a status is no verdict: asked again until the end.
    while !matches!(w.caught_up(to).await, Ok(true)) && began.elapsed() < CATCH_UP_WAIT {
        w.run_for(Duration::from_millis(500)).await?;
    }
    if began.elapsed() >= Duration::from_millis(500) {
        eprintln!(
            "chaos: the controller decided every period due by the check {:.1} s after the settle time",
            began.elapsed().as_secs_f64()
        );
    }
    Ok(to)
}

/// How long an injection waits for a leader (a first one, or another after a fault).
const LEASE_WAIT: Duration = Duration::from_secs(60);

/// Injects `fault`, lets it heal; the failover times and the evidence it measured.
async fn inject(w: &mut World, fault: Fault, mode: Mode) -> Result<Injected> {
    let window = mode.window();
    let mut inj = Injected::default();
    match fault.base() {
        Fault::Dr(_) => anyhow::bail!("two-cluster scenarios run their own course (dr::run)"),
        Fault::LeaderSigstop => leader_sigstop(w, mode, &mut inj).await?,
        Fault::LeaderSigkill => leader_sigkill(w, mode, &mut inj).await?,
        Fault::MixedVersions => alternate_releases(w, mode, &mut inj).await?,
        Fault::RollingSigterm => rolling_sigterm(w, mode, &mut inj).await?,
        Fault::ApiserverRestart | Fault::EtcdRestart => {
            restart_component(w, fault, mode, &mut inj).await?
        }
        Fault::EtcdPause => etcd_pause(w, mode, &mut inj).await?,
        Fault::PostgresStop => postgres_stop(w, mode, &mut inj).await?,
        Fault::ClockAhead | Fault::ClockBehind => skewed_leader(w, fault, mode, &mut inj).await?,
        Fault::Partition => partition(w, mode, &mut inj).await?,
        Fault::ReplacePause => replace_pause(w, mode, &mut inj).await?,
        Fault::ReplaceHungTx => replace_hung_tx(w, mode, &mut inj).await?,
        Fault::LeaderSigstopMariadb | Fault::ReplacePauseMariadb => {
            anyhow::bail!(
                "{} is injected as the row it repeats (Fault::base)",
                fault.name()
            )
        }
        Fault::StatusWipe => status_wipe(w, mode, &mut inj).await?,
        Fault::QueueResumer => return outside::queue_resumer(w, window).await,
        Fault::DbCutAtCompletion => return outside::db_cut_at_completion(w, window).await,
        Fault::BurstPause => anyhow::bail!("burst-pause runs its own course (run_burst)"),
        Fault::PreparedLeaderSigstop | Fault::PreparedLeaderSigkill | Fault::EditBeforeInstant => {
            anyhow::bail!("{} runs its own course (prepared::run)", fault.name())
        }
        Fault::RealLeaderFreeze
        | Fault::RealContainerKill
        | Fault::RealPodDelete
        | Fault::RealWorkloadFreeze
        | Fault::RealPodDeleteWorking
        | Fault::RealNodeDrain
        | Fault::RealKubeletPartition => {
            anyhow::bail!("{} runs on the real node (real::run)", fault.name())
        }
    }
    Ok(inj)
}

/// leader-sigstop: the workload paused, the leader SIGSTOPped for the window while another
/// takes over, then SIGCONT. Proves the leader was stopped at the takeover and at the end.
async fn leader_sigstop(w: &mut World, mode: Mode, inj: &mut Injected) -> Result<()> {
    let window = mode.window();
    for sj in w.sjs.clone() {
        w.pause_workload(&sj.name, true);
    }
    let (leader, _) = w.wait_leader(None, Instant::now(), LEASE_WAIT).await?;
    let idx = w.process(leader);
    w.signal(leader, "STOP").await?;
    inj.from = Some(Timestamp::now());
    let t0 = Instant::now();
    let (_, took) = w.wait_leader(Some(leader), t0, LEASE_WAIT).await?;
    inj.failovers.push(took);
    let at_takeover = w.env.controller_stopped(idx);
    w.run_for(window.saturating_sub(t0.elapsed())).await?;
    let at_end = w.process(leader) == idx && w.env.controller_stopped(idx);
    inj.proofs.push(Proof::new(
        at_takeover && at_end,
        format!(
            "the leader (process {idx}) was seen stopped at the takeover ({at_takeover}) and at the end of the window ({at_end})"
        ),
    ));
    w.signal(leader, "CONT").await?;
    for sj in w.sjs.clone() {
        w.pause_workload(&sj.name, false);
    }
    Ok(())
}

/// leader-sigkill: [`Mode::kills`] times, SIGKILL of whichever replica leads, an equal share of
/// the window after each. Proves each killed leader ended by SIGKILL.
async fn leader_sigkill(w: &mut World, mode: Mode, inj: &mut Injected) -> Result<()> {
    let window = mode.window();
    let kills = mode.kills();
    let mut killed = Vec::new();
    for k in 0..kills {
        w.wait_running(LEASE_WAIT).await?;
        let (leader, _) = w.wait_leader(None, Instant::now(), LEASE_WAIT).await?;
        let idx = w.process(leader);
        w.signal(leader, "KILL").await?;
        if k == 0 {
            inj.from = Some(Timestamp::now());
        }
        let t0 = Instant::now();
        let (_, took) = w.wait_leader(Some(leader), t0, LEASE_WAIT).await?;
        inj.failovers.push(took);
        killed.push(idx);
        w.run_for(window / kills as u32).await?;
    }
    let by_kill = killed
        .iter()
        .filter(|idx| {
            use std::os::unix::process::ExitStatusExt as _;
            matches!(w.env.controller_exit(**idx), Ok(Some(s)) if s.signal() == Some(9))
        })
        .count();
    inj.proofs.push(Proof::new(
        by_kill == kills,
        format!("{by_kill} of the {kills} leaders killed ended by SIGKILL"),
    ));
    Ok(())
}

/// rolling-sigterm: SIGTERM of every replica in turn, [`Mode::rolling_rounds`] times. Proves
/// each replica sent SIGTERM exited and was restarted.
async fn rolling_sigterm(w: &mut World, mode: Mode, inj: &mut Injected) -> Result<()> {
    let mut termed = Vec::new();
    inj.from = Some(Timestamp::now());
    for _ in 0..mode.rolling_rounds() {
        for slot in 0..world::REPLICAS {
            w.wait_running(LEASE_WAIT).await?;
            let leading = w.leader().await? == Some(slot);
            termed.push(w.process(slot));
            w.signal(slot, "TERM").await?;
            if leading {
                let (_, took) = w
                    .wait_leader(Some(slot), Instant::now(), LEASE_WAIT)
                    .await?;
                inj.failovers.push(took);
            }
        }
    }
    w.wait_running(LEASE_WAIT).await?;
    let exited = termed
        .iter()
        .filter(|idx| matches!(w.env.controller_exit(**idx), Ok(Some(_))))
        .count();
    inj.proofs.push(Proof::new(
        exited == termed.len(),
        format!(
            "{exited} of the {} replicas sent SIGTERM exited and were restarted",
            termed.len()
        ),
    ));
    Ok(())
}

/// apiserver-restart and etcd-restart: the component stopped for [`Mode::outage`], then
/// started. Proves the restart by its pid and its port refusing connections meanwhile.
async fn restart_component(
    w: &mut World,
    fault: Fault,
    mode: Mode,
    inj: &mut Injected,
) -> Result<()> {
    let (component, port) = if fault == Fault::EtcdRestart {
        ("etcd", etcd_port())
    } else {
        (
            "kube-apiserver",
            evidence::url_port(&world::api_server()?).context("no port in the API server's URL")?,
        )
    };
    let before = evidence::cluster_pid(None, component);
    let probe = PortProbe::start(port);
    inj.from = Some(Timestamp::now());
    cluster("stop", component).await?;
    w.run_for(mode.outage()).await?;
    cluster("start", component).await?;
    let (probes, refused) = probe.finish().await;
    let after = evidence::cluster_pid(None, component);
    inj.proofs.extend(evidence::restart_proofs(&Restart {
        component: component.to_string(),
        before: before.map(|p| format!("pid {p}")),
        after: after.map(|p| format!("pid {p}")),
        old_alive_after: before.is_some_and(|p| Some(p) != after && evidence::process_alive(p)),
        port,
        probes,
        refused,
    }));
    Ok(())
}

/// etcd-pause: etcd SIGSTOPped for the window, then SIGCONT. Proves it by sampling the
/// process's state.
async fn etcd_pause(w: &mut World, mode: Mode, inj: &mut Injected) -> Result<()> {
    let window = mode.window();
    let pid = evidence::cluster_pid(None, "etcd");
    cluster("pause", "etcd").await?;
    if let Some(pid) = pid {
        // Not judged here: a process never seen stopped fails the samples below.
        evidence::wait_stopped(pid, Duration::from_secs(2)).await;
    }
    inj.from = Some(Timestamp::now());
    let sampler = pid.map(StateSampler::start);
    w.run_for(window).await?;
    let (samples, stopped) = match sampler {
        Some(s) => s.finish().await,
        None => (0, 0),
    };
    cluster("resume", "etcd").await?;
    let what = pid.map_or("etcd (no live pid before the pause)".to_string(), |p| {
        format!("etcd (pid {p})")
    });
    inj.proofs
        .push(evidence::pause_proof(&what, samples, stopped));
    Ok(())
}

/// postgres-stop: PostgreSQL stopped for the window, then started. Proves the restart by the
/// postmaster's start time and its port refusing connections meanwhile.
async fn postgres_stop(w: &mut World, mode: Mode, inj: &mut Injected) -> Result<()> {
    let window = mode.window();
    let before = postmaster_started().await;
    let port = crate::database_port()?;
    let probe = PortProbe::start(port);
    inj.from = Some(Timestamp::now());
    cluster("stop", "postgres").await?;
    w.run_for(window).await?;
    cluster("start", "postgres").await?;
    let (probes, refused) = probe.finish().await;
    let after = postmaster_started().await;
    inj.proofs.extend(evidence::restart_proofs(&Restart {
        component: "postgres".to_string(),
        before: before.map(|t| format!("postmaster started {t}")),
        after: after.map(|t| format!("postmaster started {t}")),
        old_alive_after: false,
        port,
        probes,
        refused,
    }));
    Ok(())
}

/// clock-ahead-40s and clock-behind-40s: a replica restarted with its clock 40 s off leads for
/// the window, then is restarted with the right clock. Proves the skew from its log and that it
/// kept the Lease.
async fn skewed_leader(w: &mut World, fault: Fault, mode: Mode, inj: &mut Injected) -> Result<()> {
    let window = mode.window();
    let (offset, secs) = if fault == Fault::ClockAhead {
        ("+40s", 40)
    } else {
        ("-40s", -40)
    };
    let (leader, _) = w.wait_leader(None, Instant::now(), LEASE_WAIT).await?;
    let slot = (leader + 1) % world::REPLICAS;
    w.replace_replica(slot, crate::skewed_clock(offset)?)
        .await?;
    w.wait_running(LEASE_WAIT).await?;
    if !w.make_leader(slot, 8).await? {
        anyhow::bail!("the skewed replica never took the Lease");
    }
    inj.from = Some(Timestamp::now());
    let (samples, held) = w.run_for_leading(slot, window).await?;
    let (started, log) = w.started_log(slot);
    let replica = format!("replica {slot}");
    inj.proofs.push(evidence::skew_proof(
        &replica,
        secs,
        evidence::log_clock_offset(&log, started),
    ));
    inj.proofs
        .push(evidence::lease_kept_proof(&replica, samples, held));
    // Heal: the replica restarts with the right clock.
    w.replace_replica(slot, Vec::new()).await?;
    let (_, took) = w
        .wait_leader(Some(slot), Instant::now(), LEASE_WAIT)
        .await?;
    inj.failovers.push(took);
    w.wait_running(LEASE_WAIT).await?;
    Ok(())
}

/// partition: replica 0 made the leader, then its proxy to the API server stalled for the
/// window while another takes over.
async fn partition(w: &mut World, mode: Mode, inj: &mut Injected) -> Result<()> {
    let window = mode.window();
    if !w.make_leader(0, 8).await? {
        anyhow::bail!("the proxied replica never took the Lease");
    }
    if let Some(p) = &w.proxy {
        p.stall();
    }
    inj.from = Some(Timestamp::now());
    let t0 = Instant::now();
    let (other, took) = w.wait_leader(Some(0), t0, LEASE_WAIT).await?;
    inj.failovers.push(took);
    inj.proofs.push(Proof::new(
        true,
        format!(
            "replica 0 led through the proxy when it stalled; replica {other} took the Lease {:.1} s later",
            took.as_secs_f64()
        ),
    ));
    w.run_for(window.saturating_sub(t0.elapsed())).await?;
    if let Some(p) = &w.proxy {
        p.up();
    }
    Ok(())
}

/// replace-pause: the workload of `swap` paused for the window.
async fn replace_pause(w: &mut World, mode: Mode, inj: &mut Injected) -> Result<()> {
    w.pause_workload("swap", true);
    inj.from = Some(Timestamp::now());
    w.run_for(mode.window()).await?;
    w.pause_workload("swap", false);
    Ok(())
}

/// replace-hung-tx: the workload of `hang` hung in its transaction for the window (at least
/// [`HUNG_WINDOW`]), then released.
async fn replace_hung_tx(w: &mut World, mode: Mode, inj: &mut Injected) -> Result<()> {
    // Long enough in the short form too for a claim stuck behind the lock to pass its
    // 6 s deadline (lock timeout 5 s, then a retry).
    w.hang_workload("hang", true);
    inj.from = Some(Timestamp::now());
    w.run_for(mode.window().max(HUNG_WINDOW)).await?;
    w.hang_workload("hang", false);
    w.release_hung();
    Ok(())
}

/// status-wipe: [`Mode::wipe_rounds`] rounds of wiping both SingletonJobs' status, each in the
/// state it is to be wiped in. Proves the wipes took, in those states.
async fn status_wipe(w: &mut World, mode: Mode, inj: &mut Injected) -> Result<()> {
    let rounds = mode.wipe_rounds();
    inj.from = Some(Timestamp::now());
    let (mut pruned, mut running, mut wiped) = (0, 0, 0);
    for round_no in 0..rounds {
        let round = Instant::now();
        let (p, r, wi) = wipe_round(w, round_no, inj).await?;
        pruned += p;
        running += r;
        wiped += wi;
        w.run_for((mode.window() / rounds as u32).saturating_sub(round.elapsed()))
            .await?;
    }
    inj.proofs.push(Proof::new(
        wiped == 2 * rounds,
        format!(
            "{wiped} of {} status wipes took (the API server's answer kept no token, cursor or history)",
            2 * rounds
        ),
    ));
    inj.proofs.push(Proof::new(
        pruned == rounds && running == rounds,
        format!(
            "`wipe` wiped after its newest Job was pruned in {pruned} of {rounds} rounds, `kept` while a run was active in {running} of {rounds}"
        ),
    ));
    Ok(())
}

/// The newest Job of `sj` that ran, if any.
fn newest_ran(jobs: &[crate::observer::JobRecord], sj: &str) -> Option<crate::observer::JobRecord> {
    jobs.iter()
        .filter(|j| j.ran && j.sj.as_deref() == Some(sj))
        .max_by_key(|j| j.period)
        .cloned()
}

/// One round of status-wipe: (whether `wipe` was pruned, whether `kept` was running, how many
/// of the two wipes took).
async fn wipe_round(
    w: &mut World,
    round_no: usize,
    inj: &mut Injected,
) -> Result<(usize, usize, usize)> {
    // `wipe`: when its newest run's Job is already pruned, so that no Job is left to
    // show its token or period (waited for at most 30 s: with other scenarios beside
    // this one, pruning can lag the 2 s schedule).
    let pruned = w
        .wait_jobs(PRECONDITION_WAIT, Duration::from_millis(20), |jobs| {
            newest_ran(jobs, "wipe").is_some_and(|j| j.deleted.is_some())
        })
        .await? as usize;
    let mut wiped = wipe(w, "wipe").await? as usize;
    // `kept`: while a run is active.
    let running = w
        .wait_jobs(PRECONDITION_WAIT, Duration::from_millis(20), |jobs| {
            newest_ran(jobs, "kept").is_some_and(|j| !j.finished && j.deleted.is_none())
        })
        .await? as usize;
    wiped += wipe(w, "kept").await? as usize;
    // Every other round the Lease changes hands right after the wipes, so that a
    // replica with no memory of its own confirms reads the wiped status first.
    if round_no % 2 == 1 {
        let (leader, _) = w.wait_leader(None, Instant::now(), LEASE_WAIT).await?;
        w.signal(leader, "TERM").await?;
        let (_, took) = w
            .wait_leader(Some(leader), Instant::now(), LEASE_WAIT)
            .await?;
        inj.failovers.push(took);
    }
    Ok((pruned, running, wiped))
}

/// Wipes `sj`'s status ([`World::wipe_status`]) until the API server's answer shows it took, at
/// most 5 times. kubectl edit reads the object, then patches without a resourceVersion: a key the
/// controller added in between (a claim written meanwhile) is not in the patch and survives. Under
/// CI's load that window grew enough to keep 1 of 4 wipes from taking (2026-12-06); the fault this
/// row injects is the wipe, so it is sent again rather than the row failing unproven.
async fn wipe(w: &World, sj: &str) -> Result<bool> {
    for _ in 0..5 {
        if w.wipe_status(sj).await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// etcd's client port, as `hack/cluster.sh` reads it.
fn etcd_port() -> u16 {
    std::env::var("SINGLETON_ETCD_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(22379)
}

/// When PostgreSQL's postmaster started (changes with each restart), if it answers within 30 s.
async fn postmaster_started() -> Option<Timestamp> {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let got = async {
            let db = crate::pg().await?;
            let t: Timestamp = db
                .query_one("SELECT pg_postmaster_start_time()", &[])
                .await?
                .get(0);
            anyhow::Ok(t)
        };
        if let Ok(Ok(t)) = tokio::time::timeout(Duration::from_secs(5), got).await {
            return Some(t);
        }
        if Instant::now() > end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Best effort: every component the suite may have stopped or paused runs again.
async fn heal_all() {
    for (action, component) in [
        ("resume", "etcd"),
        ("start", "etcd"),
        ("start", "kube-apiserver"),
        ("start", "postgres"),
    ] {
        if let Err(e) = cluster(action, component).await {
            eprintln!("chaos: healing {component}: {e:#}");
        }
    }
}

/// Every scenario: the single-cluster ones ([`SCENARIOS`]), then the two-cluster ones
/// ([`dr::SCENARIOS`]).
pub fn all_scenarios() -> Vec<Fault> {
    SCENARIOS
        .iter()
        .copied()
        .chain(dr::SCENARIOS.iter().map(|d| Fault::Dr(*d)))
        .collect()
}

/// Runs `scenarios` in order; the rows, with a markdown table (and wall time) in `report`.
pub async fn run_all(scenarios: &[Fault], mode: Mode) -> Result<(Vec<Outcome>, String)> {
    let began = Instant::now();
    let mut outcomes = Vec::new();
    for f in scenarios {
        eprintln!("chaos: {} ({mode:?})", f.name());
        let o = run_scenario(*f, mode).await?;
        eprintln!(
            "chaos: {} done in {:.0} s{}",
            f.name(),
            o.took.as_secs_f64(),
            if o.violations.is_empty() {
                String::new()
            } else {
                format!(": {:?}", o.violations)
            }
        );
        outcomes.push(o);
    }
    let rows: Vec<Row> = outcomes.iter().map(|o| o.row.clone()).collect();
    let report = format!(
        "{}\n{mode:?} run of {} scenarios: {:.0} s wall time ({}).\n",
        check::table(&rows),
        rows.len(),
        began.elapsed().as_secs_f64(),
        Timestamp::now().strftime("%Y-%m-%d %H:%M UTC"),
    );
    Ok((outcomes, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mariadb_rows_repeat_their_postgres_rows_on_mariadb() {
        for (on_mariadb, on_postgres) in [
            (Fault::LeaderSigstopMariadb, Fault::LeaderSigstop),
            (Fault::ReplacePauseMariadb, Fault::ReplacePause),
        ] {
            assert_eq!(
                (on_mariadb.db(), on_postgres.db()),
                (Db::Mariadb, Db::Postgres)
            );
            assert_eq!(on_mariadb.base(), on_postgres);
            assert_eq!(on_mariadb.scope(), Scope::Namespace);
            for mode in [Mode::Short, Mode::Full] {
                assert_eq!(on_mariadb.expect(mode), on_postgres.expect(mode));
                assert!(on_mariadb.expect(mode).pause, "{}", on_mariadb.name());
            }
            let names = |f: Fault| f.sjs().into_iter().map(|s| s.name).collect::<Vec<_>>();
            assert_eq!(names(on_mariadb), names(on_postgres));
        }
        let all = all_scenarios();
        let names: HashSet<&str> = all.iter().map(|f| f.name()).collect();
        assert_eq!(names.len(), all.len(), "scenario names are unique");
    }
}
