//! `/metrics` end to end (issue 7): read the OpenMetrics text from running replicas and check that
//! the counters move in the scenarios that should move them: a run, a failover, a stale token
//! refused by a workload through the fence function, and a database outage.

use std::time::Duration;

use anyhow::Result;
use e2e::{
    Env, backstop_secret, backstop_spec, ensure, http_get, metric, pg, sj_yaml, table_prefix,
};

#[tokio::test]
async fn a_run_moves_runs_started_tokens_issued_and_the_skew_histogram() -> Result<()> {
    let mut env = Env::new("metrics-run").await?;
    let c = env.start_controller(&[]).await?;
    let resp = http_get(env.metrics_addr(c).await?, "/metrics").await?;
    ensure(
        &env,
        resp.status == 200
            && resp.header("content-type") == Some(singleton::metrics::CONTENT_TYPE)
            && resp.body.ends_with("# EOF\n"),
        (
            "OpenMetrics on /metrics",
            resp.status,
            resp.header("content-type"),
        ),
    )
    .await?;
    ensure(
        &env,
        metric(&resp.body, "singleton_leader", &[]) == 1.0,
        "single-replica mode always leads",
    )
    .await?;

    env.create_sj(&sj_yaml("m", "*/2 * * * * *", "")).await?;
    let ns = env.ns.clone();
    let sj = [("namespace", ns.as_str()), ("name", "m")];
    let text = env
        .wait_for("a run in the metrics", Duration::from_secs(60), || async {
            let t = env.metrics(c).await?;
            let moved = metric(&t, "singleton_runs_started_total", &sj) >= 1.0
                && metric(&t, "singleton_tokens_issued_total", &sj) >= 1.0
                && metric(&t, "singleton_schedule_skew_seconds_count", &[]) >= 1.0;
            Ok(moved.then_some(t))
        })
        .await?;
    // Each Job is created after its instant (G4), and promptly.
    let count = metric(&text, "singleton_schedule_skew_seconds_count", &[]);
    let mean = metric(&text, "singleton_schedule_skew_seconds_sum", &[]) / count;
    ensure(&env, (0.0..30.0).contains(&mean), ("mean skew", mean)).await?;
    let next = metric(&text, "singleton_next_run_seconds", &sj);
    ensure(&env, (-5.0..=2.5).contains(&next), ("next run in", next)).await?;
    ensure(
        &env,
        metric(&text, "singleton_reconcile_duration_seconds_count", &[]) >= 1.0,
        "reconciles measured",
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_failover_makes_the_survivor_leader_and_moves_its_transitions() -> Result<()> {
    let mut env = Env::new("metrics-failover").await?;
    // One replica logs JSON, the other human text: the harness reads the address from both.
    let a = env.start_controller(&["--leader-elect"]).await?;
    let b = env
        .start_controller(&["--leader-elect", "--log-json"])
        .await?;
    let leader = env
        .wait_for(
            "one leader by the metrics",
            Duration::from_secs(30),
            || async {
                let (ta, tb) = (env.metrics(a).await?, env.metrics(b).await?);
                let (la, lb) = (
                    metric(&ta, "singleton_leader", &[]),
                    metric(&tb, "singleton_leader", &[]),
                );
                Ok(match (la, lb) {
                    (1.0, 0.0) => Some(a),
                    (0.0, 1.0) => Some(b),
                    _ => None,
                })
            },
        )
        .await?;
    let survivor = if leader == a { b } else { a };
    let before = env
        .wait_for(
            "the standby contending for the lease",
            Duration::from_secs(20),
            || async {
                let t = env.metrics(survivor).await?;
                let contended = metric(
                    &t,
                    "singleton_lease_acquire_attempts_failed_total",
                    &[("reason", "Contention")],
                ) > 0.0;
                Ok(contended.then_some(t))
            },
        )
        .await?;
    ensure(
        &env,
        metric(&before, "singleton_leader_transitions_total", &[]) == 0.0,
        "the standby has not led yet",
    )
    .await?;

    env.stop_controller(leader, true).await?; // SIGKILL: no release, the lease must expire
    let after = env
        .wait_for("the survivor leading", Duration::from_secs(30), || async {
            let t = env.metrics(survivor).await?;
            Ok((metric(&t, "singleton_leader", &[]) == 1.0).then_some(t))
        })
        .await?;
    ensure(
        &env,
        metric(&after, "singleton_leader_transitions_total", &[]) == 1.0
            && metric(&after, "singleton_lease_acquire_seconds_count", &[]) == 1.0
            && metric(&after, "singleton_leader_epoch", &[]) >= 2.0,
        (
            "transitions, acquisition and epoch moved",
            metric(&after, "singleton_leader_transitions_total", &[]),
            metric(&after, "singleton_leader_epoch", &[]),
        ),
    )
    .await?;
    // It waited for the dead leader's lease to expire (4 s in the harness).
    let waited = metric(&after, "singleton_lease_acquire_seconds_sum", &[]);
    ensure(&env, waited >= 3.0, ("acquisition took", waited)).await?;
    Ok(())
}

#[tokio::test]
async fn a_stale_token_refused_by_a_workload_is_exported() -> Result<()> {
    let mut env = Env::new("metrics-fence").await?;
    let p = table_prefix(&env);
    backstop_secret(&env, "db", &e2e::database_url()?, true).await?;
    let c = env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("f", "*/2 * * * * *", &backstop_spec("db", &p, "")))
        .await?;
    env.wait_for("token 3", Duration::from_secs(60), || async {
        let s = env.get_sj("f").await?.status.unwrap_or_default();
        Ok((s.fencing_token >= 3).then_some(()))
    })
    .await?;
    let ns = env.ns.clone();
    let workload = [
        ("namespace", ns.as_str()),
        ("name", "f"),
        ("source", "workload"),
    ];
    let t = env.metrics(c).await?;
    ensure(
        &env,
        metric(&t, "singleton_stale_writes_refused_total", &workload) == 0.0,
        "no refusal before the stale write",
    )
    .await?;

    // A run paused since token 1 wakes up and writes: the fence refuses it in its transaction.
    let job_key = format!("{}/f", env.ns);
    let mut db = pg().await?;
    let tx = db.transaction().await?;
    let err = tx
        .query(&format!("SELECT {p}fence($1, $2)"), &[&job_key, &1i64])
        .await
        .expect_err("an old token must be refused");
    ensure(
        &env,
        err.code().map(|c| c.code()) == Some("SF001"),
        ("SQLSTATE", err.to_string()),
    )
    .await?;
    drop(tx);

    // The next reconcile samples the database's count.
    let t = env
        .wait_for(
            "the refusal in the metrics",
            Duration::from_secs(30),
            || async {
                let t = env.metrics(c).await?;
                Ok(
                    (metric(&t, "singleton_stale_writes_refused_total", &workload) >= 1.0)
                        .then_some(t),
                )
            },
        )
        .await?;
    ensure(
        &env,
        metric(
            &t,
            "singleton_backstop_operation_seconds_count",
            &[("op", "claim")],
        ) >= 3.0,
        "claims measured",
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_database_outage_moves_backstop_errors_and_missed_periods() -> Result<()> {
    let mut env = Env::new("metrics-outage").await?;
    let p = table_prefix(&env);
    let proxy = e2e::proxied_backstop_secret(&env, "db").await?;
    let c = env.start_controller(&[]).await?;
    let spec = backstop_spec(
        "db",
        &p,
        "  startingDeadlineSeconds: 3\n  catchUp: All\n  concurrencyPolicy: Allow\n",
    );
    env.create_sj(&sj_yaml("o", "*/2 * * * * *", &spec)).await?;
    let ns = env.ns.clone();
    let sj = [("namespace", ns.as_str()), ("name", "o")];
    let unavailable = [("kind", "BackstopUnavailable")];
    let errors_before = env
        .wait_for("a first run", Duration::from_secs(30), || async {
            let t = env.metrics(c).await?;
            Ok((metric(&t, "singleton_runs_started_total", &sj) >= 1.0)
                .then(|| metric(&t, "singleton_backstop_errors_total", &unavailable)))
        })
        .await?;

    proxy.down();
    env.wait_for(
        "backstop errors and missed periods in the metrics",
        Duration::from_secs(40),
        || async {
            let t = env.metrics(c).await?;
            let errors = metric(&t, "singleton_backstop_errors_total", &unavailable);
            let missed = metric(
                &t,
                "singleton_periods_missed_total",
                &[
                    ("namespace", ns.as_str()),
                    ("name", "o"),
                    ("reason", "BackstopUnavailable"),
                ],
            );
            Ok((errors > errors_before && missed >= 1.0).then_some(()))
        },
    )
    .await?;

    // Healed: runs resume.
    let started = metric(&env.metrics(c).await?, "singleton_runs_started_total", &sj);
    proxy.up();
    env.wait_for("runs after the outage", Duration::from_secs(40), || async {
        let t = env.metrics(c).await?;
        Ok((metric(&t, "singleton_runs_started_total", &sj) > started).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_deleted_singletonjobs_series_are_removed() -> Result<()> {
    let mut env = Env::new("metrics-delete").await?;
    let c = env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("gone", "*/2 * * * * *", "")).await?;
    env.create_sj(&sj_yaml("stays", "*/2 * * * * *", ""))
        .await?;
    let ns = env.ns.clone();
    let label = |name: &str| format!("namespace=\"{ns}\",name=\"{name}\"");
    let series = |text: &str, name: &str| -> Vec<String> {
        let l = label(name);
        text.lines()
            .filter(|line| !line.starts_with('#') && line.contains(&l))
            .map(str::to_string)
            .collect()
    };
    env.wait_for(
        "runs of both in the metrics",
        Duration::from_secs(60),
        || async {
            let t = env.metrics(c).await?;
            let both = ["gone", "stays"].iter().all(|n| {
                metric(
                    &t,
                    "singleton_runs_started_total",
                    &[("namespace", &ns), ("name", n)],
                ) >= 1.0
            });
            Ok(both.then_some(()))
        },
    )
    .await?;
    env.sjs().delete("gone", &Default::default()).await?;
    let text = env
        .wait_for(
            "every series of the deleted SingletonJob gone",
            Duration::from_secs(30),
            || async {
                let t = env.metrics(c).await?;
                Ok(series(&t, "gone").is_empty().then_some(t))
            },
        )
        .await?;
    ensure(
        &env,
        !series(&text, "stays").is_empty(),
        (
            "the other SingletonJob keeps its series",
            series(&text, "stays"),
        ),
    )
    .await?;
    Ok(())
}
