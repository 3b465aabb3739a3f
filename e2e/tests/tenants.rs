//! One tenant never claims for another (issue 34). One controller serves two namespaces that
//! share one backstop database and one database role, as docs/multi-cluster.md's set-up has
//! them; it watches all namespaces but only the SingletonJobs labelled with this test's run
//! (`--label-selector`), so it never acts on other tests' objects.
//!
//! N4 from the security review, tried from outside: `thief` in one namespace names the job key
//! of `victim` in another (`spec.backstop.jobKey`). Before job keys had owners, the thief ran
//! Jobs under the victim's key within seconds (4 in 20 s) and its claims raised the victim's
//! fence. An outside watch of both namespaces' Jobs and the backstop's claim rows count it.

use std::time::Duration;

use anyhow::Result;
use e2e::{
    Env, Observer, RUN_LABEL, backstop_secret, backstop_spec, database_url, ensure,
    events_with_reason, pg, sj_yaml, table_prefix,
};
use tokio::sync::mpsc;

/// The reason recorded with a period whose job key belongs to another namespace.
const NOT_OWNER: &str = "JobKeyOwnedElsewhere";

/// How many of `env`'s SingletonJob `name`'s periods are recorded with `reason`.
async fn recorded(env: &Env, name: &str, reason: &str) -> Result<u64> {
    let sj = env.get_sj(name).await?;
    Ok(sj
        .status
        .map(|s| s.history)
        .unwrap_or_default()
        .iter()
        .filter(|h| h.reason.as_deref() == Some(reason))
        .map(|h| h.count.max(1))
        .sum())
}

#[tokio::test]
async fn a_job_key_of_another_namespace_runs_nothing_and_its_owner_runs_on() -> Result<()> {
    let mut victim = Env::new("tenant-victim").await?;
    let thief = Env::new("tenant-thief").await?;
    let run = victim.ns.clone();
    let selector = format!("{RUN_LABEL}={run}");
    victim
        .start_controller(&["--namespace=", "--label-selector", &selector])
        .await?;
    let url = database_url()?;
    backstop_secret(&victim, "db", &url, true).await?;
    backstop_secret(&thief, "db", &url, true).await?;
    let prefix = table_prefix(&victim);
    let key = format!("{}/victim", victim.ns);
    let (tx, _seen) = mpsc::unbounded_channel();
    let victims = Observer::start(victim.client.clone(), &victim.ns, tx.clone());
    let thiefs = Observer::start(thief.client.clone(), &thief.ns, tx);
    let ran = |o: &Observer| o.jobs().iter().filter(|j| j.ran).count();

    // The victim runs first: its first claim records its namespace as the key's owner.
    let spec = backstop_spec("db", &prefix, "  concurrencyPolicy: Allow\n");
    victim
        .create_sj_labelled(&run, &sj_yaml("victim", "*/2 * * * * *", &spec))
        .await?;
    victim
        .wait_for(
            "the victim's first run",
            Duration::from_secs(30),
            || async { Ok((ran(&victims) >= 1).then_some(())) },
        )
        .await?;

    // The thief names the victim's key, in the same tables.
    let borrowed = backstop_spec(
        "db",
        &prefix,
        &format!("    jobKey: {key}\n  concurrencyPolicy: Allow\n"),
    );
    thief
        .create_sj_labelled(&run, &sj_yaml("thief", "*/2 * * * * *", &borrowed))
        .await?;
    let before = ran(&victims);
    let refused = thief
        .wait_for(
            "three of the thief's periods refused",
            Duration::from_secs(40),
            || async {
                let n = recorded(&thief, "thief", NOT_OWNER).await?;
                Ok((n >= 3).then_some(n))
            },
        )
        .await;
    let refused = match refused {
        Ok(n) => n,
        Err(e) => {
            let jobs: Vec<String> = thiefs.jobs().iter().map(|j| j.name.clone()).collect();
            return Err(e.context(format!(
                "the thief's Jobs: {jobs:?}\n{}",
                thief.dump().await
            )));
        }
    };

    // Nothing of the thief ran; the victim ran on meanwhile, and every claim row of its key is
    // one of its own runs.
    let thief_jobs: Vec<String> = thiefs.jobs().iter().map(|j| j.name.clone()).collect();
    ensure(
        &thief,
        thief_jobs.is_empty(),
        ("no Job of the thief", &thief_jobs),
    )
    .await?;
    let during = ran(&victims) - before;
    ensure(
        &victim,
        during >= 2,
        (
            "the victim's runs while the thief's periods were refused",
            during,
        ),
    )
    .await?;
    let db = pg().await?;
    let claimants: Vec<String> = db
        .query(
            &format!("SELECT job_name FROM {prefix}claims WHERE job = $1"),
            &[&key],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .filter(|n: &String| !n.starts_with("victim-"))
        .collect();
    ensure(
        &victim,
        claimants.is_empty(),
        ("claims of the victim's key by anyone else", &claimants),
    )
    .await?;
    let owner: Option<String> = db
        .query_one(
            &format!("SELECT namespace FROM {prefix}fences WHERE job = $1"),
            &[&key],
        )
        .await?
        .get(0);
    ensure(
        &victim,
        owner.as_deref() == Some(victim.ns.as_str()),
        ("the key's recorded owner", &owner),
    )
    .await?;
    // The thief is told why, and not who owns the key.
    let events = events_with_reason(&thief, NOT_OWNER).await?;
    let said: Vec<String> = events.iter().filter_map(|e| e.message.clone()).collect();
    ensure(
        &thief,
        !said.is_empty()
            && said
                .iter()
                .all(|m| m.contains("belongs to another namespace")),
        ("the thief's Warning Events", &said),
    )
    .await?;
    println!(
        "thief: {refused} periods refused ({NOT_OWNER}), 0 Jobs; victim: {during} runs meanwhile, owner {owner:?}"
    );
    Ok(())
}
