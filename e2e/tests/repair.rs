//! Bulk repair, `kubectl singleton rerun NAME --from --to --only failed|missed|all [--dry-run]
//! [--parallel N] [--order oldest|newest]`, against the real API server, job controller and
//! PostgreSQL (docs/operations.md, "Repair a range"). A SingletonJob every two seconds fails
//! while its template cannot run (no node matches, `activeDeadlineSeconds: 1`), then succeeds once
//! fixed; the dry run lists exactly the failed periods (judged from outside: the history and the
//! backstop's claim rows), the repair re-runs each once with a new token newest first, two at a
//! time, the claim rows move to the new tokens with outcome Succeeded, and an identical second
//! request starts nothing. Missed periods (suspended ones) are found and run by `--only missed`.
//! Bad input is refused with the reason, nothing run.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::{
    Env, backstop_secret, backstop_spec, database_url, ensure, never_scheduled, pg, plugin,
    sj_yaml, stderr, stdout, table_prefix,
};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Patch, PatchParams};
use singleton::api::{OperationPhase, OperationStatus, Outcome, SingletonJob};

const EVERY_2S: &str = "*/2 * * * * *";
/// The missed-periods row's schedule. Forbid makes a repair's runs wait for the schedule's, and
/// every 2 s left it no gap on a loaded machine (kwok's Jobs taking 2 s each: a run due each time
/// one finished; warm `make test`, 2026-12-07: nothing started in 60 s).
const EVERY_5S: &str = "*/5 * * * * *";

/// A template that cannot run: the job controller fails it a second after it starts.
fn failing(spec: &str) -> String {
    never_scheduled(sj_yaml("pay", EVERY_2S, spec)).replace(
        "      backoffLimit: 0\n",
        "      backoffLimit: 0\n      activeDeadlineSeconds: 1\n",
    )
}

fn op(out: &std::process::Output) -> Result<OperationStatus> {
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("-o json: {} {}", stdout(out), stderr(out)))
}

/// Periods by their newest history outcome.
fn outcomes(sj: &SingletonJob) -> BTreeMap<Timestamp, Outcome> {
    let mut out = BTreeMap::new();
    for h in sj.status.iter().flat_map(|s| s.history.iter()).rev() {
        if h.last_period.is_none() {
            out.insert(h.period.0, h.outcome);
        }
    }
    out
}

/// The claim rows of `job` in [`from`, `to`]: period -> (token, outcome).
async fn claims(
    prefix: &str,
    job: &str,
    from: Timestamp,
    to: Timestamp,
) -> Result<BTreeMap<Timestamp, (i64, Option<String>)>> {
    let rows = pg()
        .await?
        .query(
            &format!(
                "SELECT period, token, outcome FROM {prefix}claims WHERE job = $1 AND period BETWEEN $2 AND $3"
            ),
            &[&job, &from, &to],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect())
}

/// The SingletonJob's rerun Jobs (named `<name>-<seconds>-r<token>`): period -> token.
async fn rerun_jobs(env: &Env) -> Result<BTreeMap<Timestamp, Vec<u64>>> {
    let mut out: BTreeMap<Timestamp, Vec<u64>> = BTreeMap::new();
    for j in env.job_list().await? {
        if !j
            .metadata
            .name
            .as_deref()
            .unwrap_or_default()
            .contains("-r")
        {
            continue;
        }
        let period = j
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("singleton.dev/period"))
            .and_then(|p| p.parse().ok());
        if let Some(p) = period {
            out.entry(p).or_default().push(e2e::token_of(&j));
        }
    }
    Ok(out)
}

/// The outcome of the newest history entry covering `period` (folded ranges included).
fn newest(st: &singleton::api::SingletonJobStatus, period: Timestamp) -> Option<Outcome> {
    st.history
        .iter()
        .find(|h| {
            let last = h.last_period.as_ref().map_or(h.period.0, |l| l.0);
            h.period.0 <= period && period <= last
        })
        .map(|h| h.outcome)
}

/// The periods of the missed-periods row's schedule ([`EVERY_5S`]) in [`from`, `to`] whose
/// newest record says they never ran.
fn never_ran(
    st: &singleton::api::SingletonJobStatus,
    from: Timestamp,
    to: Timestamp,
) -> Vec<Timestamp> {
    let schedule = singleton::schedule::Schedule::parse(EVERY_5S, None, Default::default())
        .expect("the test's schedule");
    schedule
        .iter_after(from - jiff::SignedDuration::from_nanos(1))
        .take_while(|p| *p <= to)
        .filter(|p| matches!(newest(st, *p), Some(Outcome::Skipped | Outcome::Missed)))
        .collect()
}

fn succeeded(j: &Job) -> bool {
    j.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0
}

/// A SingletonJob `pay` whose runs fail until its template is fixed, then succeed: the range
/// of its decided periods and those that failed (at least three), oldest first.
async fn failing_then_fixed(
    env: &Env,
    spec: &str,
) -> Result<(Timestamp, Timestamp, Vec<Timestamp>)> {
    let ns = &env.ns;
    env.create_sj(&failing(spec)).await?;
    env.wait_for("three failed runs", Duration::from_secs(60), || async {
        let sj = env.get_sj("pay").await?;
        let failed = outcomes(&sj)
            .values()
            .filter(|o| **o == Outcome::Failed)
            .count();
        Ok((failed >= 3).then_some(()))
    })
    .await?;
    // Fixed: the template runs (kwok's pods succeed), and runs succeed from now on.
    let api: kube::Api<SingletonJob> = kube::Api::namespaced(env.client.clone(), ns);
    let fix = serde_json::json!({"spec": {"jobTemplate": {"spec": {
        "activeDeadlineSeconds": null,
        "template": {"spec": {"nodeSelector": null}},
    }}}});
    api.patch("pay", &PatchParams::default(), &Patch::Merge(&fix))
        .await?;
    let fixed_at = Timestamp::now();
    let sj = env
        .wait_for(
            "two succeeded runs after the fix",
            Duration::from_secs(60),
            || async {
                let sj = env.get_sj("pay").await?;
                let seen = outcomes(&sj);
                let ok = seen
                    .iter()
                    .filter(|(p, o)| **p > fixed_at && **o == Outcome::Succeeded)
                    .count();
                // Every run of the broken template decided (under load the job controller fails
                // them late): the failed periods are then a fixed set, the same for the dry run
                // and the repair.
                let settled = !seen
                    .iter()
                    .any(|(p, o)| *p <= fixed_at && *o == Outcome::Running);
                Ok((ok >= 2 && settled).then_some(sj))
            },
        )
        .await?;
    // The range: from the first period to the last one decided with an outcome.
    let seen = outcomes(&sj);
    let (from, to) = (
        *seen.keys().next().context("a period")?,
        *seen.keys().last().context("a period")?,
    );
    let failed: Vec<Timestamp> = seen
        .iter()
        .filter(|(_, o)| **o == Outcome::Failed)
        .map(|(p, _)| *p)
        .collect();
    Ok((from, to, failed))
}

/// The dry run lists exactly the `failed` periods, newest first, and runs nothing.
async fn dry_run_lists_the_failed(env: &Env, range: &[&str], failed: &[Timestamp]) -> Result<()> {
    let args = [
        &["rerun", "pay"][..],
        range,
        &["--dry-run", "--order", "newest", "-o", "json"],
    ]
    .concat();
    let dry = op(&plugin(&args, &[])?)?;
    let mut newest_first = failed.to_vec();
    newest_first.reverse();
    let listed: Vec<Timestamp> = dry.periods.iter().map(|p| p.0).collect();
    ensure(
        env,
        dry.phase == OperationPhase::Done
            && listed == newest_first
            && dry.selected == Some(failed.len() as u64),
        ("the dry run lists the failed periods", &dry, &newest_first),
    )
    .await?;
    ensure(
        env,
        rerun_jobs(env).await?.is_empty(),
        "a dry run starts nothing",
    )
    .await?;
    let table = plugin(
        &[&["rerun", "pay"][..], range, &["--dry-run"]].concat(),
        &[],
    )?;
    let first_line = format!("  {}", singleton::naming::period_rfc3339(failed[0]));
    ensure(
        env,
        table.status.success()
            && stdout(&table).contains("dry run: would re-run")
            && stdout(&table).contains(&first_line),
        (
            "the dry run's table lists the periods",
            stdout(&table),
            stderr(&table),
        ),
    )
    .await?;

    Ok(())
}

/// The repair, newest first, two at a time: each failed period re-run once, none other, each
/// re-run succeeded. Returns the re-runs' tokens by period.
async fn repair_re_runs_each_once(
    env: &Env,
    range: &[&str],
    failed: &[Timestamp],
) -> Result<BTreeMap<Timestamp, Vec<u64>>> {
    let args = [
        &["rerun", "pay"][..],
        range,
        &[
            "--order",
            "newest",
            "--parallel",
            "2",
            "--wait",
            "--timeout",
            "90s",
            "-o",
            "json",
        ],
    ]
    .concat();
    let done = op(&plugin(&args, &[])?)?;
    ensure(
        env,
        done.phase == OperationPhase::Done && done.started == failed.len() as u64,
        ("the repair is done", &done),
    )
    .await?;
    let reruns = env
        .wait_for(
            "the re-runs to succeed",
            Duration::from_secs(60),
            || async {
                let jobs = env.job_list().await?;
                let all = jobs.iter().filter(|j| {
                    j.metadata
                        .name
                        .as_deref()
                        .unwrap_or_default()
                        .contains("-r")
                });
                Ok(all.clone().all(succeeded).then_some(all.count()))
            },
        )
        .await?;
    let by_period = rerun_jobs(env).await?;
    ensure(
        env,
        reruns == failed.len()
            && by_period.keys().copied().collect::<Vec<_>>() == failed.to_vec()
            && by_period.values().all(|t| t.len() == 1),
        (
            "one re-run per failed period, none other",
            &by_period,
            &failed,
        ),
    )
    .await?;
    // Newest first: the tokens were issued in the order claimed, so they fall as periods rise.
    let tokens: Vec<u64> = by_period.values().map(|t| t[0]).collect();
    ensure(
        env,
        tokens.windows(2).all(|w| w[0] > w[1]),
        ("claimed newest first", &tokens),
    )
    .await?;
    Ok(by_period)
}

#[tokio::test]
async fn failed_periods_are_re_run_once_each_and_a_second_request_starts_nothing() -> Result<()> {
    let mut env = Env::new("repair").await?;
    let ns = env.ns.clone();
    let prefix = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    env.start_controller(&[]).await?;
    let spec = backstop_spec(
        "db",
        &prefix,
        "  concurrencyPolicy: Allow\n  successfulJobsHistoryLimit: 100\n  failedJobsHistoryLimit: 100\n",
    );
    let (from, to, failed) = failing_then_fixed(&env, &spec).await?;
    let key = format!("{ns}/pay");
    let before = claims(&prefix, &key, from, to).await?;
    // The backstop says the same as the history: each failed period's row has outcome Failed.
    for p in &failed {
        ensure(
            &env,
            before.get(p).and_then(|c| c.1.as_deref()) == Some("Failed"),
            ("the claim row records the failure", p, &before),
        )
        .await?;
    }
    let (f, t) = (from.to_string(), to.to_string());
    let range = ["-n", &ns, "--from", &f, "--to", &t];

    dry_run_lists_the_failed(&env, &range, &failed).await?;
    let by_period = repair_re_runs_each_once(&env, &range, &failed).await?;
    let after = env
        .wait_for(
            "the outcomes recorded in the backstop",
            Duration::from_secs(30),
            || async {
                let rows = claims(&prefix, &key, from, to).await?;
                let all = failed
                    .iter()
                    .all(|p| rows.get(p).and_then(|c| c.1.as_deref()) == Some("Succeeded"));
                Ok(all.then_some(rows))
            },
        )
        .await?;
    for p in &failed {
        let (old, new) = (before[p].0, after[p].0);
        ensure(
            &env,
            new as u64 == by_period[p][0] && new > old,
            ("the claim row moved to the re-run's token", p, old, new),
        )
        .await?;
    }

    // An identical request: nothing new, and the dry run says so too.
    let args = [
        &["rerun", "pay"][..],
        &range,
        &["--order", "newest", "-o", "json"],
    ]
    .concat();
    let again = op(&plugin(&args, &[])?)?;
    ensure(
        &env,
        again.phase == OperationPhase::Done && again.message.contains("identical to repair"),
        ("a second identical request", &again),
    )
    .await?;
    let next = Timestamp::now();
    env.wait_for(
        "a later period decided",
        Duration::from_secs(20),
        || async {
            let sj = env.get_sj("pay").await?;
            Ok(outcomes(&sj).keys().any(|p| *p > next).then_some(()))
        },
    )
    .await?;
    ensure(
        &env,
        rerun_jobs(&env).await? == by_period,
        "the identical request started nothing",
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn missed_periods_are_found_and_run_and_bad_requests_are_refused() -> Result<()> {
    let mut env = Env::new("repair-missed").await?;
    let ns = env.ns.clone();
    let prefix = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    env.start_controller(&[]).await?;
    // Forbid (the default): a repair's runs wait for the schedule's; every Job kept to count.
    let keep = "  successfulJobsHistoryLimit: 100\n  failedJobsHistoryLimit: 100\n";
    env.create_sj(&sj_yaml(
        "pay",
        EVERY_5S,
        &backstop_spec("db", &prefix, keep),
    ))
    .await?;
    env.wait_for("a run", Duration::from_secs(30), || async {
        let sj = env.get_sj("pay").await?;
        Ok(outcomes(&sj)
            .values()
            .any(|o| *o == Outcome::Succeeded)
            .then_some(()))
    })
    .await?;
    // Suspended for a while: its periods are recorded Skipped, never run.
    let api: kube::Api<SingletonJob> = kube::Api::namespaced(env.client.clone(), &ns);
    let suspend = |on: bool| serde_json::json!({"spec": {"suspend": on}});
    api.patch(
        "pay",
        &PatchParams::default(),
        &Patch::Merge(&suspend(true)),
    )
    .await?;
    let suspended_at = Timestamp::now();
    env.wait_for("periods skipped", Duration::from_secs(30), || async {
        let sj = env.get_sj("pay").await?;
        let skipped = sj
            .status
            .iter()
            .flat_map(|s| s.history.iter())
            .filter(|h| h.outcome == Outcome::Skipped)
            .map(|h| h.count)
            .sum::<u64>();
        Ok((skipped >= 2).then_some(()))
    })
    .await?;
    api.patch(
        "pay",
        &PatchParams::default(),
        &Patch::Merge(&suspend(false)),
    )
    .await?;
    let resumed_at = Timestamp::now();
    env.wait_for("a run after the pause", Duration::from_secs(30), || async {
        let sj = env.get_sj("pay").await?;
        let ran = outcomes(&sj)
            .iter()
            .any(|(p, o)| *p > resumed_at && *o == Outcome::Succeeded);
        Ok(ran.then_some(()))
    })
    .await?;
    // To a moment past the resume: a period due just after it may still have been skipped
    // (the controller sees the resume a little later).
    let (f, t) = (
        (suspended_at - jiff::SignedDuration::from_secs(2)).to_string(),
        (resumed_at + jiff::SignedDuration::from_secs(2)).to_string(),
    );
    let range = ["-n", &ns, "--from", &f, "--to", &t, "--only", "missed"];
    let dry = op(&plugin(
        &[&["rerun", "pay"][..], &range, &["--dry-run", "-o", "json"]].concat(),
        &[],
    )?)?;
    // What never ran, judged from the history of the dry run's fixed range: the suspended
    // periods (Skipped), and any the schedule missed meanwhile (Forbid: a period due while the
    // previous run was still going is Missed, Superseded, on a loaded machine).
    let (from, to) = (
        dry.from.as_ref().context("the dry run's range")?.0,
        dry.to.as_ref().context("the dry run's range")?.0,
    );
    let st = env.get_sj("pay").await?.status.unwrap_or_default();
    let want = never_ran(&st, from, to);
    let skipped = want
        .iter()
        .filter(|p| newest(&st, **p) == Some(Outcome::Skipped))
        .count();
    let listed: Vec<Timestamp> = dry.periods.iter().map(|p| p.0).collect();
    ensure(
        &env,
        skipped >= 1 && listed == want,
        ("missed periods listed, oldest first", &dry, &want),
    )
    .await?;
    let (f, t) = (from.to_string(), to.to_string());
    let range = ["-n", &ns, "--from", &f, "--to", &t, "--only", "missed"];
    let done = op(&plugin(
        &[
            &["rerun", "pay"][..],
            &range,
            &["--wait", "--timeout", "60s", "-o", "json"],
        ]
        .concat(),
        &[],
    )?)?;
    ensure(
        &env,
        done.phase == OperationPhase::Done && done.started == want.len() as u64,
        ("missed periods run", &done),
    )
    .await?;
    let ran = rerun_jobs(&env).await?;
    ensure(
        &env,
        ran.keys().copied().collect::<Vec<_>>() == want,
        ("a run per missed period", &ran),
    )
    .await?;

    // Bad input: refused with the reason, nothing run.
    let refusals: [(&[&str], &str); 3] = [
        (&["--from", &t, "--to", &f], "is after --to"),
        (
            &["--from", &t, "--to", &t, "--parallel", "0"],
            "--parallel must be 1 to 100",
        ),
        (
            &["--from", &f, "--to", &t, "--parallel", "2"],
            "needs concurrencyPolicy Allow",
        ),
    ];
    for (args, says) in refusals {
        let out = plugin(&[&["rerun", "pay", "-n", &ns][..], args].concat(), &[])?;
        ensure(
            &env,
            !out.status.success() && stderr(&out).contains(says),
            (args, says, stdout(&out), stderr(&out)),
        )
        .await?;
    }
    let future = (Timestamp::now() + jiff::SignedDuration::from_hours(1)).to_string();
    let out = plugin(
        &[
            "rerun", "pay", "-n", &ns, "--from", &future, "--to", &future,
        ],
        &[],
    )?;
    ensure(
        &env,
        out.status.code() == Some(1)
            && stderr(&out).contains("rejected by the controller")
            && stderr(&out).contains("not decided yet"),
        ("a range in the future", stderr(&out)),
    )
    .await?;
    ensure(
        &env,
        rerun_jobs(&env).await? == ran,
        "nothing run by a refused request",
    )
    .await?;
    Ok(())
}
