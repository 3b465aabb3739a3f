//! Pauses and crashes inside the run protocol (issue 16), at the named points the controller's
//! e2e build compiles in (`--features failpoints`, src/failpoint.rs). For each point the leader
//! freezes there (SIGSTOP, as a GC or VM pause would freeze it) past its Lease while the other
//! replica completes the period, the period's Job runs and is pruned (history limits 0); then the
//! frozen leader resumes with everything it held. An outside watch of Job objects, started before
//! the first run, must show no period with two Jobs that ran; a simulated pod per Job that ran
//! (e2e/src/sim_pods.rs) registers as its run's attempt and commits a fenced write, and the
//! database's rows must show at most one attempt per period committed, none overlapping; the
//! backstop must refuse the period's token afterwards (it was retired when the period was
//! decided).

use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::sim_pods::SimulatedPods;
use e2e::{
    Env, FAST_ELECTION, backstop_secret, backstop_spec, database_url, ensure, once_at, pg, sj_yaml,
    table_prefix,
};
use jiff::Timestamp;
use singleton::failpoint;

const LEASE_NAME: &str = "singleton-controller";

fn elect() -> Vec<&'static str> {
    [FAST_ELECTION, &["--lease-name", LEASE_NAME]].concat()
}

/// The replica (`e2e-<idx>`) that holds the Lease.
async fn leader(env: &Env) -> Result<Option<usize>> {
    env.lease_holder(LEASE_NAME).await
}

/// How the frozen leader is let go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// SIGSTOP at the point, SIGCONT after the period was completed and its Job pruned.
    Pause,
    /// The process aborts at the point (a crash between two steps).
    Crash,
}

/// The scenario for one failpoint; see the module doc.
async fn stale_leader_at(point: &str, fault: Fault) -> Result<()> {
    let mut env = Env::new(&format!("fp-{point}")).await?;
    let prefix = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    // The watch, and a simulated pod for every Job it sees run: each registers as its run's
    // attempt and commits a fenced write, so that attempts are counted from the database too.
    let pods = SimulatedPods::start(env.client.clone(), &env.ns, &prefix).await?;
    let watch = &pods.watch;

    // Replica 0 leads, with the point armed; replica 1 stands by.
    let action = match fault {
        Fault::Pause => "stop",
        Fault::Crash => "abort",
    };
    let armed = [(
        "SINGLETON_FAILPOINTS".to_string(),
        format!("{point}={action}"),
    )];
    env.start_controller_with_env(&armed, &elect()).await?;
    env.wait_for("replica 0 to lead", Duration::from_secs(30), || async {
        Ok((leader(&env).await? == Some(0)).then_some(()))
    })
    .await?;
    env.start_controller(&elect()).await?;
    // The points of the claim, the create and the confirm are the same whether the run is
    // prepared ahead (on by default, issue 33) or claimed at its instant; `resume` is the
    // unprepared run's own (a prepared run's resume is `resume-prepared`, in the chaos rows and
    // tests/preparing.rs), so its rows run the SingletonJob without preparation.
    let lead = match point {
        failpoint::RESUME => "  prepareLeadSeconds: 0\n",
        _ => "",
    };
    let extra = backstop_spec(
        "db",
        &prefix,
        &format!("  successfulJobsHistoryLimit: 0\n  failedJobsHistoryLimit: 0\n{lead}"),
    );
    // One period only, a few seconds from now: after it is decided no newer token exists, so
    // the fence can refuse its token only because it was retired.
    let at = Timestamp::now() + jiff::SignedDuration::from_secs(4);
    env.create_sj(&sj_yaml("fp", &once_at(at), &extra)).await?;

    // The leader reaches the point on its first claim and freezes (or dies) there.
    env.wait_for(
        &format!("replica 0 to {action} at {point}"),
        Duration::from_secs(30),
        || async {
            let done = match fault {
                Fault::Pause => env.controller_stopped(0),
                Fault::Crash => env.controller_exited(0),
            };
            Ok(done.then_some(()))
        },
    )
    .await?;
    let first = env
        .get_sj("fp")
        .await?
        .status
        .and_then(|s| s.pending_claim.or_else(|| s.active.first().cloned()))
        .context("the frozen leader's claim")?;

    // The other replica takes over and completes that period: it ran, and is decided.
    env.wait_for(
        "replica 1 to complete the frozen leader's period",
        Duration::from_secs(60),
        || async {
            let st = env.get_sj("fp").await?.status.unwrap_or_default();
            let decided = st.history.iter().any(|h| {
                h.period == first.period
                    && h.job_name.is_some()
                    && matches!(
                        h.outcome,
                        singleton::api::Outcome::Succeeded | singleton::api::Outcome::Failed
                    )
            });
            Ok(decided.then_some(()))
        },
    )
    .await?;
    // ... and its Job is pruned (history limit 0): the name is free again.
    env.wait_for(
        "the completed period's Job to be pruned",
        Duration::from_secs(30),
        || async {
            let gone = env
                .job_list()
                .await?
                .iter()
                .all(|j| j.metadata.name.as_deref() != Some(first.job_name.as_str()));
            Ok(gone.then_some(()))
        },
    )
    .await?;

    if fault == Fault::Pause {
        // The stale leader resumes where it froze, with everything it held.
        env.signal_controller(0, "CONT").await?;
        // It exits once it notices its lost Lease; whatever it sent meanwhile is in the watch.
        env.wait_for("replica 0 to exit", Duration::from_secs(30), || async {
            Ok(env.controller_exited(0).then_some(()))
        })
        .await?;
    }
    // Any Job no claim knows (a late create, left suspended) is gone again.
    env.wait_for(
        "no Job left that never ran",
        Duration::from_secs(30),
        || async {
            let jobs = env.job_list().await?;
            let idle = jobs.iter().any(|j| {
                j.spec.as_ref().and_then(|s| s.suspend) == Some(true)
                    && j.metadata.deletion_timestamp.is_none()
            });
            Ok((!idle).then_some(()))
        },
    )
    .await?;

    // G1, counted from outside: no period has two Jobs that ran.
    let seconds = watch.second_runs();
    ensure(
        &env,
        seconds.is_empty() && watch.relists() == 0,
        (
            format!("{point}: periods with two Jobs that ran"),
            &seconds,
            ("watch restarts", watch.relists()),
            watch.jobs(),
        ),
    )
    .await?;

    // G1 at the level of processes, from the database's rows: at most one attempt of the period
    // committed, none after a newer one registered, and the period's pod did write.
    let (attempts, started, committed) = pods.verdict().await?;
    ensure(
        &env,
        attempts.max <= 1 && attempts.overlapping == 0 && started >= 1,
        (
            format!(
                "{point}: attempts that committed per period (max) {}, overlapping {}, pods started {started}, committed {committed}",
                attempts.max, attempts.overlapping
            ),
            &attempts.details,
        ),
    )
    .await?;

    // G3: the frozen leader's period is decided, so its token is retired: a write carrying it
    // (the stale run's, however it came back) is refused by the database.
    let mut db = pg().await?;
    let tx = db.transaction().await?;
    let fenced = tx
        .query_one(
            &format!("SELECT {prefix}fence($1, $2)"),
            &[&format!("{}/fp", env.ns), &(first.token as i64)],
        )
        .await;
    let refused = matches!(&fenced, Err(e) if e.code().map(|c| c.code()) == Some("SF001"));
    ensure(
        &env,
        refused,
        (
            format!(
                "{point}: a write with the decided period's token {}",
                first.token
            ),
            fenced.map(|r| r.get::<_, i64>(0)),
        ),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn paused_after_the_claim_write() -> Result<()> {
    stale_leader_at(failpoint::CLAIM_WRITTEN, Fault::Pause).await
}

#[tokio::test]
async fn paused_after_the_backstop_claim() -> Result<()> {
    stale_leader_at(failpoint::BACKSTOP_CLAIMED, Fault::Pause).await
}

#[tokio::test]
async fn paused_after_the_re_read() -> Result<()> {
    stale_leader_at(failpoint::REREAD, Fault::Pause).await
}

/// The one a gate check cannot close: the create is sent after the stale leader resumes.
#[tokio::test]
async fn paused_in_the_create_lane() -> Result<()> {
    stale_leader_at(failpoint::CREATE_LANE, Fault::Pause).await
}

#[tokio::test]
async fn paused_before_the_confirm() -> Result<()> {
    stale_leader_at(failpoint::CONFIRM, Fault::Pause).await
}

#[tokio::test]
async fn paused_before_the_resume() -> Result<()> {
    stale_leader_at(failpoint::RESUME, Fault::Pause).await
}

#[tokio::test]
async fn crashed_after_the_create() -> Result<()> {
    stale_leader_at(failpoint::CONFIRM, Fault::Crash).await
}

#[tokio::test]
async fn crashed_before_the_resume() -> Result<()> {
    stale_leader_at(failpoint::RESUME, Fault::Crash).await
}

/// The backstop's schema lock held by a frozen leader (the burst-pause stall, CI 2026-12-06).
///
/// Every connection's first use migrates the schema under one advisory lock. The leader freezes
/// holding it, on its first SingletonJob's probe; the other replica takes over while the lock
/// is still held (its own probes wait for it, and time out) until the server ends the frozen
/// session's idle transaction. From then on every SingletonJob of the namespace sharing that
/// database must run its period: a lock held by a frozen process delays runs (the
/// server's idle-transaction timeout bounds it), it must not strand them.
#[tokio::test]
async fn paused_holding_the_schema_lock() -> Result<()> {
    const SJS: usize = 8;
    let mut env = Env::new("fp-schema-locked").await?;
    let prefix = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    let pods = SimulatedPods::start(env.client.clone(), &env.ns, &prefix).await?;
    let watch = &pods.watch;
    let armed = [(
        "SINGLETON_FAILPOINTS".to_string(),
        format!("{}=stop", failpoint::SCHEMA_LOCKED),
    )];
    env.start_controller_with_env(&armed, &elect()).await?;
    env.wait_for("replica 0 to lead", Duration::from_secs(30), || async {
        Ok((leader(&env).await? == Some(0)).then_some(()))
    })
    .await?;
    env.start_controller(&elect()).await?;
    let extra = backstop_spec(
        "db",
        &prefix,
        "  successfulJobsHistoryLimit: 1\n  failedJobsHistoryLimit: 1\n",
    );
    // A whole second, as the schedule names it (the periods the watch reports).
    let at = Timestamp::from_second(
        (Timestamp::now() + jiff::SignedDuration::from_secs(10)).as_second(),
    )?;
    for i in 0..SJS {
        env.create_sj(&sj_yaml(&format!("lk-{i}"), &once_at(at), &extra))
            .await?;
    }
    env.wait_for(
        "replica 0 to stop holding the schema lock",
        Duration::from_secs(30),
        || async { Ok(env.controller_stopped(0).then_some(())) },
    )
    .await?;
    // The server ends the frozen session's transaction after twice the operation timeout
    // (20 s); the new leader's backoff after failed probes reaches 16 s by then, and a
    // SingletonJob that found another probe in flight waits the longest backoff (30 s): about
    // 30 s after the instant here. Ninety seconds leave room for two loaded cores; a stranded
    // period (the bug this catches) waits for its next instant, a year away.
    let bound = Duration::from_secs(90);
    let waited = env
        .wait_for(
            "every SingletonJob to run its period after the lock was freed",
            Duration::from_secs(10) + bound,
            || async {
                let ran: std::collections::HashSet<String> = watch
                    .jobs()
                    .into_iter()
                    .filter(|j| j.ran && j.period == Some(at))
                    .filter_map(|j| j.sj)
                    .collect();
                Ok((ran.len() == SJS).then(Timestamp::now))
            },
        )
        .await;
    let last = match waited {
        Ok(t) => t,
        Err(e) => {
            env.signal_controller(0, "CONT").await?;
            return Err(e);
        }
    };
    env.signal_controller(0, "CONT").await?;
    env.wait_for("replica 0 to exit", Duration::from_secs(30), || async {
        Ok(env.controller_exited(0).then_some(()))
    })
    .await?;
    let seconds = watch.second_runs();
    ensure(
        &env,
        seconds.is_empty(),
        ("periods with two Jobs that ran", &seconds, watch.jobs()),
    )
    .await?;
    println!(
        "schema lock held by a frozen leader: the last of {SJS} periods ran {} s after its instant",
        last.duration_since(at).as_secs_f64()
    );
    Ok(())
}
