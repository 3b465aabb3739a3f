//! The hostile-tenant suite (issue 34): one namespace does everything a tenant can do against the
//! others at once, while another namespace's every-2-seconds SingletonJobs are measured from
//! outside (a watch of their Jobs: when each was first allowed to run, minus its instant).
//!
//! The hostile namespace has, all at once:
//! - [`SLOW`] every-second SingletonJobs whose backstop answers probes at once but takes 9 s per
//!   claim (a trigger on its claims table): more than the controller's 128 reconcile slots (N3);
//! - SingletonJobs nested deeper than the decoder accepts (N1) and ones of about 1 MB (N5);
//! - a SingletonJob naming the healthy namespace's job key, in the same tables and role (N4);
//! - [`LABELLED`] Jobs of about 200 KB labelled as the controller's, naming a healthy
//!   SingletonJob (N5).
//!
//! One controller serves both (all namespaces, only the objects labelled with this test's run, as
//! tests/noisy.rs does). The healthy namespace's skew p99 with all of that going on must stay
//! within 2× of its value alone in the same run, and none of its periods may be lost.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use e2e::singleton::backstop::{Backstop, ConnectionConfig, SecretKeys, TablePrefix};
use e2e::skew::{Skews, Window, describe, healthy_namespace, instants, measure, p99, window};
use e2e::{
    Env, RUN_LABEL, backstop_secret, backstop_spec, database_url, ensure, kubectl_stdin, pg,
    poisoned, sj_yaml, table_prefix,
};
use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, PostParams};

/// The healthy namespace's SingletonJobs, every 2 seconds each, claimed in a backstop.
const HEALTHY: [&str; 2] = ["tick-0", "tick-1"];
/// The hostile namespace's every-second SingletonJobs behind a slow database: more than the
/// controller's 128 reconcile slots.
const SLOW: usize = 130;
/// How long each of their claims takes (the backstop's operation timeout is 10 s).
const CLAIM_SECONDS: u32 = 9;
/// SingletonJobs of about [`HUGE_BYTES`] each.
const HUGE: usize = 6;
const HUGE_BYTES: usize = 1_000_000;
/// Jobs labelled `singleton.dev/job` that no SingletonJob made, of about 200 KB each.
const LABELLED: usize = 40;
/// How long each phase is measured.
const WINDOW: Duration = Duration::from_secs(30);
/// The "alone" p99 is taken as at least this: a quiet baseline of tens of milliseconds would
/// turn the ordinary noise of a shared 2-core machine into a failure, while a stall behind a slow
/// database is its claim time (9 s), three times twice this. 1 s (tests/noisy.rs's floor) failed
/// once in `make test`'s lanes (CI 2026-12-06: one sample of 28 at 2.1 s, with 20 to 34 slow
/// claims as in every run; the same code, and the code before it, gave ratios 0.21 to 0.38 on
/// an idle machine): the windows are measured 30 s apart, under whatever the other lanes load.
/// 1.5 s failed once too (fresh-clone CI 2026-12-06: p50 0.30 s alone, 0.76 s with, one sample
/// of 30 at 3.2 s while the cluster chaos rows ran beside it). At 2 s the bound is 4 s, still
/// well under the 9 s stall that a claim behind the slow database would cause.
const BASELINE_FLOOR: f64 = 2.0;

/// Creates the backstop tables of `prefix` and makes every claim in them take
/// [`CLAIM_SECONDS`]: a database that answers `SELECT 1` at once and claims slowly.
async fn slow_tables(prefix: &str) -> Result<()> {
    let data = BTreeMap::from([("url".to_string(), ByteString(database_url()?.into_bytes()))]);
    let config = ConnectionConfig::from_secret(&data, &SecretKeys::default())?;
    Backstop::new(config, TablePrefix::new(prefix)?)?
        .ensure_schema()
        .await?;
    let db = pg().await?;
    db.batch_execute(&format!(
        "CREATE FUNCTION {prefix}slowly() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep({CLAIM_SECONDS}); RETURN NEW; END $$;
         CREATE TRIGGER {prefix}slowly BEFORE INSERT ON {prefix}claims \
         FOR EACH ROW EXECUTE FUNCTION {prefix}slowly();"
    ))
    .await?;
    Ok(())
}

/// A SingletonJob of about [`HUGE_BYTES`], as JSON (its padding is kept by the template's
/// schema, which preserves unknown fields). Hourly: its size is the attack, not its runs.
fn huge(ns: &str, name: &str, run: &str) -> String {
    let padding = "x".repeat(HUGE_BYTES);
    format!(
        r#"{{"apiVersion":"singleton.dev/v1alpha1","kind":"SingletonJob",
        "metadata":{{"name":"{name}","namespace":"{ns}","labels":{{"{RUN_LABEL}":"{run}"}}}},
        "spec":{{"schedule":"0 0 * * * *","jobTemplate":{{"spec":{{"template":{{"spec":{{
          "restartPolicy":"Never","containers":[{{"name":"work","image":"busybox"}}]}}}},
          "padding":"{padding}"}}}}}}}}"#
    )
}

/// A suspended Job in `env`'s namespace labelled as the controller's, naming `sj`, with about
/// 200 KB of annotation.
async fn labelled_job(env: &Env, name: &str, sj: &str) -> Result<()> {
    let job: Job = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "labels": {"singleton.dev/job": sj},
            "annotations": {"pad": "y".repeat(200_000)},
        },
        "spec": {
            "suspend": true,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "work", "image": "busybox"}],
            }},
        },
    }))?;
    Api::<Job>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &job)
        .await?;
    Ok(())
}

/// The healthy namespace's runs in the window that began at `from` and ends now.
async fn healthy_window(env: &Env, skews: &Skews, from: Timestamp) -> Result<Window> {
    let due = instants(from, Timestamp::now(), 2);
    window(env, skews, &HEALTHY, &due).await
}

/// The sum of `name` over the hostile namespace's series in the controller's metrics.
async fn hostile_sum(healthy: &Env, hostile: &Env, name: &str) -> Result<f64> {
    let text = healthy.metrics(0).await?;
    let labels = format!("namespace=\"{}\"", hostile.ns);
    Ok(text
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(&labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// How many of the hostile namespace's SingletonJobs are reported Undecodable.
async fn undecodable(healthy: &Env, hostile: &Env) -> Result<f64> {
    hostile_sum(healthy, hostile, "singleton_undecodable_singletonjobs").await
}

/// Sets up everything the hostile namespace does (see the module doc).
async fn attack(healthy: &Env, hostile: &Env, run: &str) -> Result<()> {
    let slow_prefix = format!("{}slow_", table_prefix(hostile));
    slow_tables(&slow_prefix).await?;
    backstop_secret(hostile, "slow", &database_url()?, true).await?;
    backstop_secret(hostile, "db", &database_url()?, true).await?;
    // The borrowed key: the healthy namespace's first SingletonJob, in its tables.
    let borrowed = backstop_spec(
        "db",
        &table_prefix(healthy),
        &format!(
            "    jobKey: {}/{}\n  concurrencyPolicy: Allow\n",
            healthy.ns, HEALTHY[0]
        ),
    );
    hostile
        .create_sj_labelled(run, &sj_yaml("thief", "*/2 * * * * *", &borrowed))
        .await?;
    for name in ["deep-0", "deep-1"] {
        kubectl_stdin(&["create", "-f", "-"], &poisoned(&hostile.ns, name, run))?;
    }
    for i in 0..HUGE {
        kubectl_stdin(
            &["create", "-f", "-"],
            &huge(&hostile.ns, &format!("huge-{i}"), run),
        )?;
    }
    for i in 0..LABELLED {
        labelled_job(hostile, &format!("{}-{i}", HEALTHY[0]), HEALTHY[0]).await?;
    }
    let spec = backstop_spec("slow", &slow_prefix, "  concurrencyPolicy: Allow\n");
    let creates = (0..SLOW).map(|i| {
        let yaml = sj_yaml(&format!("slow-{i}"), "* * * * * *", &spec);
        async move { hostile.create_sj_labelled(run, &yaml).await }
    });
    for r in futures::future::join_all(creates).await {
        r?;
    }
    Ok(())
}

/// Waits until every attack is under way: a claim of the slow database has begun, the thief
/// has been refused, the deep SingletonJobs are reported.
async fn attack_under_way(healthy: &Env, hostile: &Env) -> Result<()> {
    let db = pg().await?;
    healthy
        .wait_for(
            "a slow claim under way, the thief refused, the deep ones reported",
            Duration::from_secs(120),
            || async {
                let sleeping: i64 = db
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'",
                        &[],
                    )
                    .await?
                    .get(0);
                let thief = hostile.get_sj("thief").await?.status.unwrap_or_default();
                let refused = thief
                    .history
                    .iter()
                    .any(|h| h.reason.as_deref() == Some("JobKeyOwnedElsewhere"));
                let deep = undecodable(healthy, hostile).await?;
                Ok((sleeping > 0 && refused && deep >= 2.0).then_some(()))
            },
        )
        .await
}

#[tokio::test]
async fn a_hostile_tenant_does_everything_at_once_and_another_namespaces_runs_keep_time()
-> Result<()> {
    let mut healthy = Env::new("hostile-healthy").await?;
    let hostile = Env::new("hostile-tenant").await?;
    let run = healthy.ns.clone();
    let selector = format!("{RUN_LABEL}={run}");
    healthy
        .start_controller(&["--namespace=", "--label-selector", &selector])
        .await?;

    let (_observer, skews) = healthy_namespace(&healthy, &run, &HEALTHY, "*/2 * * * * *").await?;

    // Alone.
    let (started, from) = (Instant::now(), Timestamp::now());
    measure(&healthy, "the window alone", started, WINDOW).await?;
    let alone = healthy_window(&healthy, &skews, from).await?;

    // Everything at once.
    let setting_up = Instant::now();
    attack(&healthy, &hostile, &run).await?;
    if let Err(e) = attack_under_way(&healthy, &hostile).await {
        let seen = hostile.dump().await;
        return Err(e.context(seen.chars().take(8000).collect::<String>()));
    }
    let set_up = setting_up.elapsed();
    let deferred_before =
        hostile_sum(&healthy, &hostile, "singleton_backstop_deferred_total").await?;
    let (started, from) = (Instant::now(), Timestamp::now());
    measure(
        &healthy,
        "the window with the hostile tenant",
        started,
        WINDOW,
    )
    .await?;
    let with = healthy_window(&healthy, &skews, from).await?;
    let deferred = hostile_sum(&healthy, &hostile, "singleton_backstop_deferred_total").await?
        - deferred_before;

    let (a, h) = (p99(&alone.skews), p99(&with.skews));
    let ratio = h / a.max(BASELINE_FLOOR);
    let slow_claims: i64 = pg()
        .await?
        .query_one(
            &format!("SELECT count(*) FROM {}slow_claims", table_prefix(&hostile)),
            &[],
        )
        .await?
        .get(0);
    eprintln!(
        "hostile tenant: alone {}; with {SLOW} SingletonJobs behind {CLAIM_SECONDS} s claims, 2 nested {} deep, {HUGE} of {} MB, a borrowed job key and {LABELLED} labelled Jobs of 200 KB: {}; ratio {ratio:.2} (p99 with / max(p99 alone, {BASELINE_FLOOR} s); {:.2} without the floor); set up in {set_up:.1?}; {deferred} hostile reconciles put off in the window, {slow_claims} slow claims in all; memory {}",
        describe(&alone.skews),
        e2e::DEPTH,
        HUGE_BYTES / 1_000_000,
        describe(&with.skews),
        h / a,
        memory(&healthy).unwrap_or_else(|e| format!("unknown ({e})")),
    );

    // Nothing of the healthy namespace lost, in either window.
    ensure(
        &healthy,
        alone.missing.is_empty() && with.missing.is_empty(),
        (
            "every healthy period ran",
            ("alone", &alone.missing),
            ("with the hostile tenant", &with.missing),
        ),
    )
    .await?;
    ensure(
        &healthy,
        !healthy.controller_exited(0),
        "the controller exited",
    )
    .await?;
    ensure(
        &healthy,
        ratio <= 2.0,
        (
            "the healthy namespace's skew p99 within 2x of its value alone",
            describe(&alone.skews),
            describe(&with.skews),
        ),
    )
    .await?;
    // The attacks were live: the slow database was rationed, not dropped.
    ensure(
        &healthy,
        deferred > 0.0 && slow_claims > 0,
        (
            "the slow database was used, and rationed",
            ("claims", slow_claims),
            ("deferred in the window", deferred),
        ),
    )
    .await?;
    thief_ran_nothing(&healthy, &hostile).await?;
    Ok(())
}

/// The borrowed key ran nothing: no Job of the thief, every claim of the key the owner's own,
/// and the labelled Jobs were left as they were (suspended, not adopted, not deleted).
async fn thief_ran_nothing(healthy: &Env, hostile: &Env) -> Result<()> {
    let key = format!("{}/{}", healthy.ns, HEALTHY[0]);
    let claimants: Vec<String> = pg()
        .await?
        .query(
            &format!(
                "SELECT job_name FROM {}claims WHERE job = $1",
                table_prefix(healthy)
            ),
            &[&key],
        )
        .await?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .filter(|n| !n.starts_with(&format!("{}-", HEALTHY[0])))
        .collect();
    let jobs = hostile.job_list().await?;
    let thief_jobs: Vec<&str> = jobs
        .iter()
        .filter_map(|j| j.metadata.name.as_deref())
        .filter(|n| n.starts_with("thief-"))
        .collect();
    let labelled_left = jobs
        .iter()
        .filter(|j| {
            j.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&format!("{}-", HEALTHY[0])))
                && j.spec.as_ref().and_then(|s| s.suspend) == Some(true)
        })
        .count();
    ensure(
        healthy,
        claimants.is_empty() && thief_jobs.is_empty() && labelled_left == LABELLED,
        (
            "the borrowed key ran nothing and the labelled Jobs were left alone",
            ("claims of the key by others", &claimants),
            ("the thief's Jobs", &thief_jobs),
            ("labelled Jobs left suspended", labelled_left),
        ),
    )
    .await
}

/// The controller's peak resident memory (`VmHWM`), for the figures.
fn memory(env: &Env) -> Result<String> {
    let pid = env
        .controller_pid(0)
        .ok_or_else(|| anyhow::anyhow!("no controller process"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .ok_or_else(|| anyhow::anyhow!("no VmHWM"))?;
    Ok(format!("peak {} resident", hwm.trim()))
}
