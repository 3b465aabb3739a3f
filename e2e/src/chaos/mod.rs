//! The fault-injection suite (issues #8 and #16): each scenario starts a world (three replicas,
//! the real control plane, PostgreSQL, the kwok node, SingletonJobs every few seconds with the
//! backstop and history limits 0, a watch of their Jobs, a workload doing fenced writes), injects
//! one fault for a bounded time, lets it heal, and checks the external truth ([`check`]).
//! `CHAOS=full` (make chaos) runs each fault for about a minute; otherwise (make e2e) a short
//! window each.

pub mod check;
pub mod dr;
pub mod dr_check;
pub mod real;
pub mod world;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Result;
use jiff::{SignedDuration, Timestamp};

use check::{Expect, Row};
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
    /// 200 SingletonJobs due at the same instant; the leader SIGSTOPped in the middle of the
    /// burst, held while another replica completes it and pruning removes the Jobs, then SIGCONT.
    BurstPause,
    /// The running workload of a Replace SingletonJob hangs in its transaction holding the fence
    /// row when the next period falls due.
    ReplaceHungTx,
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
            Fault::StatusWipe => "status-wipe",
            Fault::RealLeaderFreeze => "real-leader-freeze",
            Fault::RealContainerKill => "real-container-kill",
            Fault::RealPodDelete => "real-pod-delete",
            Fault::RealWorkloadFreeze => "real-workload-freeze",
        }
    }

    /// Whether the scenario runs on the real node's pods ([`real`]) rather than local replicas.
    pub fn on_real_node(self) -> bool {
        matches!(
            self,
            Fault::RealLeaderFreeze
                | Fault::RealContainerKill
                | Fault::RealPodDelete
                | Fault::RealWorkloadFreeze
        )
    }

    /// What the scenario must show beyond the common checks.
    pub fn expect(self) -> Expect {
        if let Fault::Dr(d) = self {
            return d.expect();
        }
        Expect {
            // The workload holds tokens past a newer run: it must see refusals.
            pause: matches!(
                self,
                Fault::LeaderSigstop | Fault::ReplacePause | Fault::RealWorkloadFreeze
            ),
            // A hung transaction is ended by the Replace (its Job deleted, its pod dead), so the
            // claim never waits out the backstop's lock timeout.
            no_backstop_missed: self == Fault::ReplaceHungTx,
            hung_replace: self == Fault::ReplaceHungTx,
        }
    }

    fn sjs(self) -> Vec<SjDef> {
        let tick = || default_sjs().remove(0);
        match self {
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
            // it keeps (default history limits) can tell the controller what ran.
            Fault::StatusWipe => vec![
                SjDef::new("wipe", "*/2 * * * * *"),
                SjDef::new("kept", "*/2 * * * * *")
                    .backstop(false)
                    .keep_history(),
            ],
            _ => default_sjs(),
        }
    }
}

/// burst-pause: SingletonJobs in the burst. All are due at one instant.
const BURST_SJS: usize = 200;
/// Of those, how many have the backstop. The controller holds a connection per SingletonJob with
/// one, and a paused leader keeps its connections while the next opens its own: 200 each would
/// be 400 against PostgreSQL's default of 100. The rest rely on the Kubernetes layers alone.
const BURST_BACKSTOPPED: usize = 32;
/// From creating the SingletonJobs to the burst: time for the leader's first reconcile of each.
const BURST_LEAD: SignedDuration = SignedDuration::from_secs(40);

/// A scenario's row and what it violated (empty: passed).
pub struct Outcome {
    pub row: Row,
    pub violations: Vec<String>,
    pub took: Duration,
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
    let began = Instant::now();
    let proxied = (fault == Fault::Partition).then_some(0);
    let mut w = World::start(&format!("chaos-{}", fault.name()), fault.sjs(), proxied).await?;
    w.wait_leader(None, Instant::now(), Duration::from_secs(60))
        .await?;
    w.wait(
        "a first run of every SingletonJob",
        Duration::from_secs(60),
        |w| Box::pin(async move { Ok(w.recovered_since(Timestamp::MIN).await?.then_some(())) }),
    )
    .await?;
    let from = Timestamp::now();
    w.run_for(mode.steady()).await?;

    let fault_began = Instant::now();
    let failovers = match inject(&mut w, fault, mode).await {
        Ok(f) => f,
        Err(e) => {
            // Leave the cluster whole for the next scenario (and the other tests).
            heal_all().await;
            return Err(e.context(format!("injecting {}", fault.name())));
        }
    };
    let fault_window = fault_began.elapsed();
    let healed = Timestamp::now();
    // Not recovering is a finding, not an abort: the row still shows what happened.
    let mut unrecovered = None;
    if let Err(e) = w
        .wait(
            "every SingletonJob running again after the fault",
            Duration::from_secs(120),
            |w| Box::pin(async move { Ok(w.recovered_since(healed).await?.then_some(())) }),
        )
        .await
    {
        eprintln!("chaos: {}: {e:#}", fault.name());
        unrecovered =
            Some("not every SingletonJob ran again within 120 s of the fault".to_string());
    }
    w.run_for(mode.settle()).await?;
    // Periods due up to 4 s ago have had time to be decided.
    let to = Timestamp::now() - SignedDuration::from_secs(4);
    let obs = w.observe(from, to, failovers).await?;
    let mut row = check::evaluate(fault.name(), fault_window, &obs);
    row.details.extend(unrecovered);
    finish(&w, row, fault.expect(), began).await
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

/// burst-pause: a burst of [`BURST_SJS`] runs due at one instant (history limits 0, Forbid);
/// the leader SIGSTOPped once some but not all of the burst's Jobs exist, held past its lease
/// while another replica completes the burst and pruning removes the Jobs, then SIGCONT. A
/// resumed leader that sends what it had in flight (a Job create) re-creates a pruned run.
async fn run_burst(mode: Mode) -> Result<Outcome> {
    let began = Instant::now();
    let lease_wait = Duration::from_secs(60);
    let mut w = World::empty("chaos-burst-pause", None).await?;
    w.wait_leader(None, Instant::now(), lease_wait).await?;
    // An hourly schedule at a whole second: the burst comes once in the scenario.
    let at = Timestamp::from_second((Timestamp::now() + BURST_LEAD).as_second())?;
    let z = at.to_zoned(jiff::tz::TimeZone::UTC);
    let schedule = format!("{} {} * * * *", z.second(), z.minute());
    let sjs = (0..BURST_SJS)
        .map(|i| SjDef::new(format!("b-{i:03}"), schedule.clone()).backstop(i < BURST_BACKSTOPPED))
        .collect();
    w.add_sjs(sjs).await?;
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
                Ok((n == BURST_SJS).then_some(()))
            })
        },
    )
    .await?;
    let ready = Timestamp::now();
    if ready + SignedDuration::from_secs(2) > at {
        anyhow::bail!(
            "setting up {BURST_SJS} SingletonJobs took until {ready}, too close to the burst at {at}: raise BURST_LEAD"
        );
    }

    // Mid-burst: a quarter of the burst's Jobs exist. Polled every 10 ms from the watch.
    let of_burst = move |j: &crate::observer::JobRecord| j.period == Some(at);
    let quarter = BURST_SJS / 4;
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
    w.signal(leader, "STOP").await?;
    let t0 = Instant::now();
    let at_pause = w.observer.jobs().iter().filter(|j| of_burst(j)).count();
    let mut notes = vec![format!(
        "leader paused with {at_pause} of the burst's {BURST_SJS} Jobs created"
    )];
    if at_pause >= BURST_SJS {
        w.signal(leader, "CONT").await?;
        anyhow::bail!("the burst was complete before the leader could be paused");
    }
    let (_, took) = match w.wait_leader(Some(leader), t0, lease_wait).await {
        Ok(l) => l,
        Err(e) => {
            w.signal(leader, "CONT").await?;
            return Err(e);
        }
    };
    let failovers = vec![took];
    // Held while another replica completes the burst and pruning removes every Job of it.
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
                ran.len() == BURST_SJS
                    && jobs
                        .iter()
                        .filter(|j| of_burst(j))
                        .all(|j| j.deleted.is_some())
            },
        )
        .await?;
    if !done {
        let jobs = w.observer.jobs();
        let left = jobs
            .iter()
            .filter(|j| of_burst(j) && j.deleted.is_none())
            .count();
        notes.push(format!(
            "after 150 s the burst was not complete and pruned ({left} of its Jobs left); resumed anyway"
        ));
    }
    w.run_for(mode.window().saturating_sub(t0.elapsed()))
        .await?;
    let idx = w.process(leader);
    w.signal(leader, "CONT").await?;
    let fault_window = t0.elapsed();
    // The resumed leader finds its Lease lost and exits; whatever it had in flight is sent by then.
    if w.wait("the resumed leader's exit", Duration::from_secs(30), |w| {
        Box::pin(async move { Ok(w.exited(leader, idx).then_some(())) })
    })
    .await
    .is_err()
    {
        notes.push("the resumed leader had not exited 30 s after SIGCONT".to_string());
    }
    w.run_for(mode.settle()).await?;
    let obs = w
        .observe(at - SignedDuration::from_secs(1), at, failovers)
        .await?;
    let mut row = check::evaluate(Fault::BurstPause.name(), fault_window, &obs);
    row.notes.extend(notes);
    finish(&w, row, Fault::BurstPause.expect(), began).await
}

/// Injects `fault`, lets it heal; the failover times it measured.
async fn inject(w: &mut World, fault: Fault, mode: Mode) -> Result<Vec<Duration>> {
    let window = mode.window();
    let lease_wait = Duration::from_secs(60);
    let mut failovers = Vec::new();
    match fault {
        Fault::Dr(_) => anyhow::bail!("two-cluster scenarios run their own course (dr::run)"),
        Fault::LeaderSigstop => {
            for sj in w.sjs.clone() {
                w.pause_workload(&sj.name, true);
            }
            let (leader, _) = w.wait_leader(None, Instant::now(), lease_wait).await?;
            w.signal(leader, "STOP").await?;
            let t0 = Instant::now();
            let (_, took) = w.wait_leader(Some(leader), t0, lease_wait).await?;
            failovers.push(took);
            w.run_for(window.saturating_sub(t0.elapsed())).await?;
            w.signal(leader, "CONT").await?;
            for sj in w.sjs.clone() {
                w.pause_workload(&sj.name, false);
            }
        }
        Fault::LeaderSigkill => {
            let kills = match mode {
                Mode::Short => 2,
                Mode::Full => 5,
            };
            for _ in 0..kills {
                w.wait_running(lease_wait).await?;
                let (leader, _) = w.wait_leader(None, Instant::now(), lease_wait).await?;
                w.signal(leader, "KILL").await?;
                let t0 = Instant::now();
                let (_, took) = w.wait_leader(Some(leader), t0, lease_wait).await?;
                failovers.push(took);
                w.run_for(window / kills).await?;
            }
        }
        Fault::RollingSigterm => {
            let rounds = match mode {
                Mode::Short => 1,
                Mode::Full => 3,
            };
            for _ in 0..rounds {
                for slot in 0..world::REPLICAS {
                    w.wait_running(lease_wait).await?;
                    let leading = w.leader().await? == Some(slot);
                    w.signal(slot, "TERM").await?;
                    if leading {
                        let (_, took) = w
                            .wait_leader(Some(slot), Instant::now(), lease_wait)
                            .await?;
                        failovers.push(took);
                    }
                }
            }
            w.wait_running(lease_wait).await?;
        }
        Fault::ApiserverRestart | Fault::EtcdRestart => {
            let component = if fault == Fault::EtcdRestart {
                "etcd"
            } else {
                "kube-apiserver"
            };
            match mode {
                Mode::Short => cluster("restart", component).await?,
                Mode::Full => {
                    cluster("stop", component).await?;
                    w.run_for(window).await?;
                    cluster("start", component).await?;
                }
            }
        }
        Fault::EtcdPause => {
            cluster("pause", "etcd").await?;
            w.run_for(window).await?;
            cluster("resume", "etcd").await?;
        }
        Fault::PostgresStop => {
            cluster("stop", "postgres").await?;
            w.run_for(window).await?;
            cluster("start", "postgres").await?;
        }
        Fault::ClockAhead | Fault::ClockBehind => {
            let offset = if fault == Fault::ClockAhead {
                "+40s"
            } else {
                "-40s"
            };
            let (leader, _) = w.wait_leader(None, Instant::now(), lease_wait).await?;
            let slot = (leader + 1) % world::REPLICAS;
            w.replace_replica(slot, crate::skewed_clock(offset)?)
                .await?;
            w.wait_running(lease_wait).await?;
            if !w.make_leader(slot, 8).await? {
                anyhow::bail!("the skewed replica never took the Lease");
            }
            w.run_for(window).await?;
            // Heal: the replica restarts with the right clock.
            w.replace_replica(slot, Vec::new()).await?;
            let (_, took) = w
                .wait_leader(Some(slot), Instant::now(), lease_wait)
                .await?;
            failovers.push(took);
            w.wait_running(lease_wait).await?;
        }
        Fault::Partition => {
            if !w.make_leader(0, 8).await? {
                anyhow::bail!("the proxied replica never took the Lease");
            }
            if let Some(p) = &w.proxy {
                p.stall();
            }
            let t0 = Instant::now();
            let (_, took) = w.wait_leader(Some(0), t0, lease_wait).await?;
            failovers.push(took);
            w.run_for(window.saturating_sub(t0.elapsed())).await?;
            if let Some(p) = &w.proxy {
                p.up();
            }
        }
        Fault::ReplacePause => {
            w.pause_workload("swap", true);
            w.run_for(window).await?;
            w.pause_workload("swap", false);
        }
        Fault::ReplaceHungTx => {
            // Long enough in the short form too for a claim stuck behind the lock to pass its
            // 6 s deadline (lock timeout 5 s, then a retry).
            w.hang_workload("hang", true);
            w.run_for(window.max(Duration::from_secs(16))).await?;
            w.hang_workload("hang", false);
            w.release_hung();
        }
        Fault::StatusWipe => {
            let rounds = match mode {
                Mode::Short => 2,
                Mode::Full => 6,
            };
            let newest_ran = |jobs: &[crate::observer::JobRecord], sj: &str| {
                jobs.iter()
                    .filter(|j| j.ran && j.sj.as_deref() == Some(sj))
                    .max_by_key(|j| j.period)
                    .cloned()
            };
            for round_no in 0..rounds {
                let round = Instant::now();
                // `wipe`: when its newest run's Job is already pruned, so that no Job is left to
                // show its token or period. Waited for at most 10 s, then wiped anyway.
                w.wait_jobs(Duration::from_secs(10), Duration::from_millis(20), |jobs| {
                    newest_ran(jobs, "wipe").is_some_and(|j| j.deleted.is_some())
                })
                .await?;
                w.wipe_status("wipe").await?;
                // `kept`: while a run is active.
                w.wait_jobs(Duration::from_secs(10), Duration::from_millis(20), |jobs| {
                    newest_ran(jobs, "kept").is_some_and(|j| !j.finished && j.deleted.is_none())
                })
                .await?;
                w.wipe_status("kept").await?;
                // Every other round the Lease changes hands right after the wipes, so that a
                // replica with no memory of its own confirms reads the wiped status first.
                if round_no % 2 == 1 {
                    let (leader, _) = w.wait_leader(None, Instant::now(), lease_wait).await?;
                    w.signal(leader, "TERM").await?;
                    let (_, took) = w
                        .wait_leader(Some(leader), Instant::now(), lease_wait)
                        .await?;
                    failovers.push(took);
                }
                w.run_for((window / rounds).saturating_sub(round.elapsed()))
                    .await?;
            }
        }
        Fault::BurstPause => anyhow::bail!("burst-pause runs its own course (run_burst)"),
        Fault::RealLeaderFreeze
        | Fault::RealContainerKill
        | Fault::RealPodDelete
        | Fault::RealWorkloadFreeze => {
            anyhow::bail!("{} runs on the real node (real::run)", fault.name())
        }
    }
    Ok(failovers)
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
