//! Multi-cluster disaster recovery (docs/multi-cluster.md): two real control planes on this
//! machine (the second from `hack/cluster.sh` with `SINGLETON_CLUSTER_NAME`, see
//! e2e/src/multicluster.rs) share one PostgreSQL; a controller per cluster (`--cluster-id east`
//! in the default cluster, `west` in the second); one SingletonJob per cluster, of different
//! names in namespaces of the same name (one owner of the job key, issue 34), made one job by
//! `spec.backstop.jobKey`. An outside checker (an
//! [`Observer`] per API server) counts the Jobs that ran per period across both clusters.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use e2e::multicluster::SecondCluster;
use e2e::{Env, Observer, backstop_secret, backstop_spec, ensure, pg, sj_yaml, table_prefix};
use jiff::Timestamp;

/// Both clusters' Envs, with the backstop Secret in each, and the shared key and prefix.
struct Two {
    east: Env,
    west: Env,
    prefix: String,
    key: String,
    second: SecondCluster,
}

async fn two(name: &str) -> Result<Two> {
    let second = SecondCluster::hold().await?;
    let east = Env::new(name).await?;
    let west = Env::new_in_namespace(&east.ns, &second.kubeconfig).await?;
    let url = e2e::database_url()?;
    backstop_secret(&east, "db", &url, true).await?;
    backstop_secret(&west, "db", &url, true).await?;
    let prefix = table_prefix(&east);
    let key = format!("dr/{}", east.ns);
    Ok(Two {
        east,
        west,
        prefix,
        key,
        second,
    })
}

impl Two {
    /// The SingletonJob "dr" (every 2 s) with the shared key and `extra` backstop lines.
    fn yaml(&self, extra: &str) -> String {
        self.yaml_with("", extra)
    }

    /// [`Self::yaml`] with `spec` lines (indented two spaces) before the backstop.
    fn yaml_with(&self, spec: &str, extra: &str) -> String {
        let lines = format!("    jobKey: {}\n{extra}", self.key);
        let spec = format!("{spec}{}", backstop_spec("db", &self.prefix, &lines));
        sj_yaml("dr", "*/2 * * * * *", &spec)
    }

    /// The claim rows of the job: period -> (cluster, token, confirmed).
    async fn claims(&self) -> Result<BTreeMap<Timestamp, (String, i64, bool)>> {
        let db = pg().await?;
        let rows = db
            .query(
                &format!(
                    "SELECT period, cluster, token, confirmed_at IS NOT NULL FROM {}claims WHERE job = $1",
                    self.prefix
                ),
                &[&self.key],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
            .collect())
    }
}

/// Waits (up to 10 s) until each cluster's watch has seen every Job its API server lists now:
/// the checks that follow read the watches, and one lagging behind would hide a duplicate.
async fn watches_caught_up(t: &Two, east: &Observer, west: &Observer) -> Result<()> {
    for (env, o) in [(&t.east, east), (&t.west, west)] {
        let listed: Vec<String> = env
            .job_list()
            .await?
            .iter()
            .filter_map(|j| j.metadata.uid.clone())
            .collect();
        env.wait_for(
            "the watch to catch up with the list",
            Duration::from_secs(10),
            || async {
                let seen: Vec<String> = o.jobs().into_iter().map(|j| j.uid).collect();
                Ok(listed.iter().all(|u| seen.contains(u)).then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}

/// Periods -> the clusters in which a Job of the period ran (was allowed to run pods).
fn ran(east: &Observer, west: &Observer) -> BTreeMap<Timestamp, Vec<&'static str>> {
    let mut by: BTreeMap<Timestamp, Vec<&'static str>> = BTreeMap::new();
    for (cluster, o) in [("east", east), ("west", west)] {
        for j in o.jobs() {
            if let (true, Some(p)) = (j.ran, j.period) {
                by.entry(p).or_default().push(cluster);
            }
        }
    }
    by
}

/// A claim row as [`falls`] reports it: period, cluster, token.
type ClaimRow = (Timestamp, String, i64);

/// G3 across clusters: the claim transaction accepts a token only above the job's one fence row
/// and raises it, and refuses a scheduled claim of a period older than another cluster's claim
/// (Superseded), so tokens rise with the periods, whichever cluster claimed them. The pairs of
/// adjacent claim rows (period, cluster, token) where they do not.
fn falls<'a>(
    claims: impl Iterator<Item = (&'a Timestamp, &'a (String, i64, bool))>,
) -> Vec<(ClaimRow, ClaimRow)> {
    let rows: Vec<ClaimRow> = claims.map(|(p, (c, t, _))| (*p, c.clone(), *t)).collect();
    rows.windows(2)
        .filter(|w| w[1].2 <= w[0].2)
        .map(|w| (w[0].clone(), w[1].clone()))
        .collect()
}

/// A spec line for [`Two::yaml_with`]: runs may overlap, so that the primary claims every
/// period at its instant even while its last Job is still active.
const ALLOW: &str = "  concurrencyPolicy: Allow\n";

/// Waits (up to 60 s) until the primary (west, started alone) has run a period, so that a
/// standby started next finds it claiming; the number of periods run so far.
async fn primary_ran(t: &Two, east: &Observer, west: &Observer) -> Result<usize> {
    t.west
        .wait_for(
            "the primary's first run",
            Duration::from_secs(60),
            || async {
                let by = ran(east, west);
                Ok((!by.is_empty()).then_some(by.len()))
            },
        )
        .await
}

fn twice(by: &BTreeMap<Timestamp, Vec<&'static str>>) -> Vec<(Timestamp, Vec<&'static str>)> {
    by.iter()
        .filter(|(_, cs)| cs.len() > 1)
        .map(|(p, cs)| (*p, cs.clone()))
        .collect()
}

/// Both clusters active, racing for every period: each period runs exactly once, in exactly one
/// cluster, and the claim row names that cluster.
#[tokio::test]
async fn both_active_every_period_runs_once_in_exactly_one_cluster() -> Result<()> {
    let mut t = two("dr-both").await?;
    let eo = Observer::watch(t.east.client.clone(), &t.east.ns).await?;
    let wo = Observer::watch(t.west.client.clone(), &t.west.ns).await?;
    let spec = t.yaml("    takeoverAfterSeconds: 10\n");
    t.east.create_sj(&spec).await?;
    t.west.create_sj(&spec).await?;
    t.east.start_controller(&["--cluster-id", "east"]).await?;
    t.west.start_controller(&["--cluster-id", "west"]).await?;
    t.east
        .wait_for("eight periods run", Duration::from_secs(60), || async {
            Ok((ran(&eo, &wo).len() >= 8).then_some(()))
        })
        .await?;
    t.east.stop_controller(0, true).await?;
    t.west.stop_controller(0, true).await?;
    watches_caught_up(&t, &eo, &wo).await?;
    let by = ran(&eo, &wo);
    ensure(&t.east, twice(&by).is_empty(), ("ran twice", twice(&by))).await?;
    // Every confirmed claim up to the last period that ran has its one Job, in its cluster.
    let last = *by.keys().last().unwrap_or(&Timestamp::UNIX_EPOCH);
    let claims = t.claims().await?;
    let mut split: BTreeMap<&str, usize> = BTreeMap::new();
    for (p, (cluster, _, confirmed)) in claims.range(..=last) {
        let there = by.get(p).cloned().unwrap_or_default();
        ensure(
            &t.east,
            *confirmed && there == [cluster.as_str()],
            ("claim and run", p, cluster, confirmed, &there),
        )
        .await?;
        *split.entry(there[0]).or_default() += 1;
    }
    let falls = falls(claims.range(..=last));
    ensure(&t.east, falls.is_empty(), ("tokens not increasing", &falls)).await?;
    println!(
        "both active: {} periods, each run once; by cluster {split:?}; observer relists east {} west {}",
        claims.range(..=last).count(),
        eo.relists(),
        wo.relists()
    );
    drop(t.second);
    Ok(())
}

/// Active/standby: the standby (east, standbyDelaySeconds 5) runs nothing while the primary
/// (west) runs; with the primary's API server stopped, the standby runs the next periods, each
/// once; with it back, the primary runs periods again within 20 s.
///
/// As in the clock test below, the primary starts first and its runs may overlap (`Allow`), so
/// that a slow Job of the primary's does not rightly hand a period to the standby while it is up.
#[tokio::test]
async fn the_standby_takes_over_when_the_primarys_api_server_stops() -> Result<()> {
    let mut t = two("dr-standby").await?;
    let eo = Observer::watch(t.east.client.clone(), &t.east.ns).await?;
    let wo = Observer::watch(t.west.client.clone(), &t.west.ns).await?;
    t.east
        .create_sj(&t.yaml_with(
            ALLOW,
            "    takeoverAfterSeconds: 6\n    standbyDelaySeconds: 5\n",
        ))
        .await?;
    t.west
        .create_sj(&t.yaml_with(ALLOW, "    takeoverAfterSeconds: 6\n"))
        .await?;
    t.west.start_controller(&["--cluster-id", "west"]).await?;
    primary_ran(&t, &eo, &wo).await?;
    t.east.start_controller(&["--cluster-id", "east"]).await?;
    t.east
        .wait_for(
            "three periods run by the primary",
            Duration::from_secs(60),
            || async {
                let by = ran(&eo, &wo);
                Ok((by.values().filter(|c| *c == &["west"]).count() >= 3).then_some(()))
            },
        )
        .await?;
    let before = ran(&eo, &wo);
    ensure(
        &t.east,
        before.values().all(|c| c == &["west"]),
        ("the standby ran while the primary was up", &before),
    )
    .await?;

    let stopped = Timestamp::now();
    t.second.apiserver("stop").await?;
    let first = t
        .east
        .wait_for(
            "three periods run by the standby",
            Duration::from_secs(60),
            || async {
                let by = ran(&eo, &wo);
                let mine: Vec<Timestamp> = by
                    .iter()
                    .filter(|(p, c)| **p > stopped && *c == &["east"])
                    .map(|(p, _)| *p)
                    .collect();
                Ok((mine.len() >= 3).then(|| mine[0]))
            },
        )
        .await?;
    let created = eo
        .jobs()
        .into_iter()
        .filter(|j| j.period == Some(first))
        .filter_map(|j| j.created)
        .next();
    t.second.apiserver("start").await?;
    // The primary comes back: its controller creates a Job again within seconds (its watches
    // retry at least every 4 s, 410 Gone at once; kube's default back-off left it blind for a
    // minute or two, watch_backoff.rs), and it must not run what the standby ran. A Job
    // created, not run: the fake node's own watches may take longer to recover.
    let ready = Timestamp::now();
    let back = t
        .east
        .wait_for(
            "the primary to create a Job again",
            Duration::from_secs(20),
            || async {
                Ok(wo
                    .jobs()
                    .into_iter()
                    // Created since the stop: by the server that came back.
                    .filter(|j| j.created.is_some_and(|c| c > stopped))
                    .find_map(|j| j.period))
            },
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    t.east.stop_controller(0, true).await?;
    t.west.stop_controller(0, true).await?;
    watches_caught_up(&t, &eo, &wo).await?;
    let by = ran(&eo, &wo);
    ensure(&t.east, twice(&by).is_empty(), ("ran twice", twice(&by))).await?;
    // The primary, back, claims the newest period at once while the standby comes to the ones
    // before it only after its delay: those are Superseded, never claimed with a higher token.
    let claims = t.claims().await?;
    let falls = falls(claims.iter());
    ensure(&t.east, falls.is_empty(), ("tokens not increasing", &falls)).await?;
    println!(
        "standby: API server stopped at {stopped}; first standby period {first}, its Job created {created:?}; API server back at {ready}, the primary's first Job since of period {back}; {} periods in all, {} in the standby",
        by.len(),
        by.values().filter(|c| *c == &["east"]).count()
    );
    Ok(())
}

/// The primary's controller freezes (SIGSTOP, failpoint backstop-claimed) right after its
/// database claim. Past the bound the standby takes the period over and runs it; the primary,
/// resumed, creates no Job for it (its confirm is refused), records ClaimedElsewhere naming the
/// standby, and a write with its token is refused by the fence.
///
/// Runs may overlap (`Allow`): under `Forbid` a standby whose own run of an earlier period is
/// still active when the bound passes claims the next period first, and the frozen one is then
/// rightly Superseded (tokens follow the periods) rather than taken over; on loaded cores a
/// run outlasts the 2 s period (a warm `make test`, 2026-12-05).
#[tokio::test]
async fn a_paused_claimer_is_taken_over_its_job_never_created_and_its_token_fenced() -> Result<()> {
    let mut t = two("dr-paused").await?;
    let eo = Observer::watch(t.east.client.clone(), &t.east.ns).await?;
    let wo = Observer::watch(t.west.client.clone(), &t.west.ns).await?;
    t.east
        .create_sj(&t.yaml_with(
            ALLOW,
            "    takeoverAfterSeconds: 5\n    standbyDelaySeconds: 2\n",
        ))
        .await?;
    t.west
        .create_sj(&t.yaml_with(ALLOW, "    takeoverAfterSeconds: 5\n"))
        .await?;
    t.east.start_controller(&["--cluster-id", "east"]).await?;
    let freeze = [(
        "SINGLETON_FAILPOINTS".to_string(),
        "backstop-claimed=stop".to_string(),
    )];
    let w = t
        .west
        .start_controller_with_env(&freeze, &["--cluster-id", "west"])
        .await?;
    t.west
        .wait_for(
            "the primary frozen after its database claim",
            Duration::from_secs(30),
            || async { Ok(t.west.controller_stopped(w).then_some(())) },
        )
        .await?;
    let pending = t
        .west
        .get_sj("dr")
        .await?
        .status
        .and_then(|s| s.pending_claim)
        .ok_or_else(|| anyhow::anyhow!("the frozen primary has no pending claim"))?;
    let (period, token) = (pending.period.0, pending.token);
    let row = t.claims().await?.get(&period).cloned();
    ensure(
        &t.east,
        row.as_ref().is_some_and(|r| r.0 == "west" && !r.2),
        ("the primary's unconfirmed row", &row),
    )
    .await?;

    // The standby takes the period over past the bound and runs it.
    t.east
        .wait_for(
            "the standby to run the frozen period",
            Duration::from_secs(30),
            || async {
                Ok(ran(&eo, &wo)
                    .get(&period)
                    .is_some_and(|c| c == &["east"])
                    .then_some(()))
            },
        )
        .await?;
    let row = t.claims().await?.get(&period).cloned();
    ensure(
        &t.east,
        row.as_ref()
            .is_some_and(|r| r.0 == "east" && r.1 as u64 > token),
        ("taken over", &row),
    )
    .await?;

    // The primary resumes: ClaimedElsewhere (east), no Job of the period in its cluster.
    t.west.signal_controller(w, "CONT").await?;
    let entry = t
        .west
        .wait_for(
            "the primary to record ClaimedElsewhere",
            Duration::from_secs(30),
            || async {
                let sj = t.west.get_sj("dr").await?;
                Ok(sj.status.and_then(|s| {
                    s.history.into_iter().find(|h| {
                        h.period.0 == period && h.reason.as_deref() == Some("ClaimedElsewhere")
                    })
                }))
            },
        )
        .await?;
    ensure(
        &t.west,
        entry.cluster.as_deref() == Some("east") && entry.token == Some(token),
        ("history entry", &entry),
    )
    .await?;
    let west_jobs = e2e::periods(&t.west.job_list().await?);
    ensure(
        &t.west,
        !west_jobs.contains(&period),
        ("a Job of the taken-over period in the primary", &west_jobs),
    )
    .await?;
    let seen = wo
        .jobs()
        .into_iter()
        .filter(|j| j.period == Some(period))
        .count();
    ensure(
        &t.west,
        seen == 0,
        ("the observer saw a primary Job of the period", seen),
    )
    .await?;

    // A write with the primary's token is refused by the fence.
    let db = pg().await?;
    let err = db
        .query(
            &format!("SELECT {}fence($1, $2)", t.prefix),
            &[&t.key, &(token as i64)],
        )
        .await
        .expect_err("the taken-over token must be refused");
    ensure(
        &t.east,
        err.code().map(|c| c.code()) == Some("SF001"),
        ("SQLSTATE", err.to_string()),
    )
    .await?;
    let by = ran(&eo, &wo);
    ensure(&t.east, twice(&by).is_empty(), ("ran twice", twice(&by))).await?;
    println!(
        "paused claimer: period {period} token {token} taken over by east; primary's Job never created; fence refused token {token}"
    );
    Ok(())
}

/// Clocks 40 s apart: the standby's controller (east) runs 40 s ahead (libfaketime; its skew
/// tolerance raised to 60 s so it acts on that clock, as a cluster whose clocks all run ahead
/// would). By its clock every period is due 40 s early, but its turn is judged by the database's
/// clock (standbyDelaySeconds 6): the primary (west, true clock) still runs every period, each
/// once, and the standby none.
///
/// The primary starts first and has run a period before the standby starts, and its runs may
/// overlap (`Allow`): under `Forbid` a primary whose Job is still active past the standby's
/// delay rightly leaves the next period to the standby (docs/multi-cluster.md), and on two
/// loaded cores a Job can take that long; the standby's turn would then be no fault of its clock.
#[tokio::test]
async fn clocks_40s_apart_the_database_clock_decides() -> Result<()> {
    let mut t = two("dr-skew").await?;
    let eo = Observer::watch(t.east.client.clone(), &t.east.ns).await?;
    let wo = Observer::watch(t.west.client.clone(), &t.west.ns).await?;
    t.east
        .create_sj(&t.yaml_with(
            ALLOW,
            "    takeoverAfterSeconds: 10\n    standbyDelaySeconds: 6\n",
        ))
        .await?;
    t.west
        .create_sj(&t.yaml_with(ALLOW, "    takeoverAfterSeconds: 10\n"))
        .await?;
    t.west.start_controller(&["--cluster-id", "west"]).await?;
    let first = primary_ran(&t, &eo, &wo).await?;
    let started = Timestamp::now();
    t.east
        .start_controller_with_env(
            &e2e::skewed_clock("+40s")?,
            &["--cluster-id", "east", "--max-clock-skew-seconds", "60"],
        )
        .await?;
    t.east
        .wait_for("six periods run", Duration::from_secs(60), || async {
            Ok((ran(&eo, &wo).len() >= first + 6).then_some(()))
        })
        .await?;
    // The skewed standby did try: it has claims pending or decided elsewhere.
    let tried = t
        .east
        .wait_for(
            "the skewed standby to record ClaimedElsewhere",
            Duration::from_secs(30),
            || async {
                let s = t.east.get_sj("dr").await?.status.unwrap_or_default();
                let n = s
                    .history
                    .iter()
                    .filter(|h| h.reason.as_deref() == Some("ClaimedElsewhere"))
                    .count();
                Ok((n > 0).then_some(n))
            },
        )
        .await?;
    // The skew applied: the standby's log runs 40 s ahead of real time (its first line, minus
    // when it was started: a start-up of a few seconds at most on top).
    let offset = e2e::chaos::evidence::log_clock_offset(&t.east.controller_log(0), started);
    ensure(
        &t.east,
        offset.is_some_and(|o| (38.0..50.0).contains(&o)),
        ("the standby's log runs 40 s ahead", offset),
    )
    .await?;
    t.east.stop_controller(0, true).await?;
    t.west.stop_controller(0, true).await?;
    watches_caught_up(&t, &eo, &wo).await?;
    let by = ran(&eo, &wo);
    ensure(&t.east, twice(&by).is_empty(), ("ran twice", twice(&by))).await?;
    ensure(
        &t.east,
        by.values().all(|c| c == &["west"]),
        ("the skewed standby ran a period", &by),
    )
    .await?;
    println!(
        "clocks 40 s apart: {} periods, all in the primary, each once; the standby recorded {tried} ClaimedElsewhere",
        by.len()
    );
    Ok(())
}
