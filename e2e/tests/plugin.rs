//! `kubectl singleton list|status|history|suspend|resume` against the real API server: the built
//! plugin binary is run as a user would run it, with the test's KUBECONFIG.

use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::{Env, ensure, plugin, sj_yaml, stderr, stdout};
use jiff::Timestamp;
use kube::ResourceExt;
use singleton::api::{HistoryEntry, Outcome, SingletonJob};
use singleton::record::conditions;

fn succeeded(sj: &SingletonJob) -> usize {
    sj.status.as_ref().map_or(0, |s| {
        s.history
            .iter()
            .filter(|h| h.outcome == Outcome::Succeeded)
            .count()
    })
}

/// The scheduled instants of the namespace's Jobs (annotation `singleton.dev/period`).
async fn job_periods(env: &Env) -> Result<Vec<Timestamp>> {
    Ok(env
        .job_list()
        .await?
        .iter()
        .filter_map(|j| j.annotations().get("singleton.dev/period")?.parse().ok())
        .collect())
}

#[tokio::test]
async fn list_status_history_suspend_resume() -> Result<()> {
    let mut env = Env::new("plugin").await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("hello", "*/3 * * * * *", ""))
        .await?;
    let ns = env.ns.clone();

    // Two runs have finished.
    let sj = env
        .wait_for(
            "two Succeeded runs of hello",
            Duration::from_secs(60),
            || async {
                let sj = env.get_sj("hello").await?;
                Ok((succeeded(&sj) >= 2).then_some(sj))
            },
        )
        .await?;
    let token = sj.status.as_ref().map_or(0, |s| s.fencing_token);

    // list -n: the table has it, with its schedule.
    let out = plugin(&["list", "-n", &ns], &[])?;
    let text = stdout(&out);
    ensure(
        &env,
        out.status.success()
            && text.starts_with("NAME")
            && text.contains("LAST RESULT")
            && text.contains("TOKEN")
            && text
                .lines()
                .any(|l| l.starts_with("hello ") && l.contains("*/3 * * * * *")),
        ("list", &text, stderr(&out)),
    )
    .await?;
    // -A adds the namespace column; -o json is a List of the objects.
    let out = plugin(&["list", "-A"], &[])?;
    let text = stdout(&out);
    ensure(
        &env,
        out.status.success()
            && text.starts_with("NAMESPACE")
            && text.lines().any(|l| l.starts_with(&format!("{ns} "))),
        ("list -A", &text, stderr(&out)),
    )
    .await?;
    let out = plugin(&["list", "-n", &ns, "-o", "json"], &[])?;
    let list: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    ensure(
        &env,
        list["items"][0]["metadata"]["name"] == "hello",
        ("list -o json", &list),
    )
    .await?;

    // status: the token (at least the one seen above) and the conditions.
    let out = plugin(&["status", "hello", "-n", &ns], &[])?;
    let text = stdout(&out);
    let shown_token: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("Fencing Token:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    ensure(
        &env,
        out.status.success()
            && shown_token >= token
            && text.contains("Conditions:")
            && text
                .lines()
                .any(|l| l.trim_start().starts_with("Ready") && l.contains("True"))
            && text.contains("Schedule:")
            && text.contains("Backstop:")
            && text.contains("Succeeded"),
        ("status", &text, stderr(&out)),
    )
    .await?;

    // history -o json: the entries, with Succeeded runs carrying tokens and Job names.
    let out = plugin(&["history", "hello", "-n", &ns, "-o", "json"], &[])?;
    let entries: Vec<HistoryEntry> = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("history -o json: {}", stdout(&out)))?;
    let ok: Vec<&HistoryEntry> = entries
        .iter()
        .filter(|h| h.outcome == Outcome::Succeeded)
        .collect();
    ensure(
        &env,
        ok.len() >= 2
            && ok
                .iter()
                .all(|h| h.token.is_some_and(|t| t >= 1) && h.job_name.is_some()),
        ("history entries", &entries),
    )
    .await?;
    let out = plugin(&["history", "hello", "-n", &ns], &[])?;
    ensure(
        &env,
        out.status.success()
            && stdout(&out).starts_with("PERIOD")
            && stdout(&out).contains("FINISH"),
        ("history table", stdout(&out)),
    )
    .await?;

    // suspend: Suspended=True, then no Job for any period after that for three periods.
    let out = plugin(&["suspend", "hello", "-n", &ns], &[])?;
    ensure(
        &env,
        out.status.success() && stdout(&out).contains("suspended (spec.suspend: false -> true)"),
        ("suspend", stdout(&out), stderr(&out)),
    )
    .await?;
    let suspended_at = env
        .wait_for("Suspended=True", Duration::from_secs(30), || async {
            let sj = env.get_sj("hello").await?;
            let st = sj.status.unwrap_or_default();
            Ok(st
                .conditions
                .iter()
                .find(|c| c.type_ == conditions::SUSPENDED && c.status == "True")
                .map(|c| c.last_transition_time.0))
        })
        .await?;
    let out = plugin(&["status", "hello", "-n", &ns], &[])?;
    ensure(
        &env,
        stdout(&out)
            .lines()
            .any(|l| l.trim_start().starts_with("Suspended") && l.contains("True")),
        ("status after suspend", stdout(&out)),
    )
    .await?;
    let quiet_until = suspended_at + Duration::from_secs(10);
    let late = env
        .wait_for(
            "three periods to pass while suspended",
            Duration::from_secs(30),
            || async {
                let late: Vec<Timestamp> = job_periods(&env)
                    .await?
                    .into_iter()
                    .filter(|p| *p > suspended_at)
                    .collect();
                Ok((!late.is_empty() || Timestamp::now() > quiet_until).then_some(late))
            },
        )
        .await?;
    ensure(
        &env,
        late.is_empty(),
        ("Jobs for periods after suspension", &late, suspended_at),
    )
    .await?;
    // Suspending again changes nothing and says so.
    let out = plugin(&["suspend", "hello", "-n", &ns], &[])?;
    ensure(
        &env,
        out.status.success() && stdout(&out).contains("already suspended"),
        ("suspend twice", stdout(&out)),
    )
    .await?;

    // resume: runs start again, with a higher token.
    let before = env
        .get_sj("hello")
        .await?
        .status
        .map_or(0, |s| s.fencing_token);
    let resumed_at = Timestamp::now();
    let out = plugin(&["resume", "hello", "-n", &ns], &[])?;
    ensure(
        &env,
        out.status.success() && stdout(&out).contains("resumed (spec.suspend: true -> false)"),
        ("resume", stdout(&out), stderr(&out)),
    )
    .await?;
    env.wait_for(
        "a Succeeded run after resume",
        Duration::from_secs(60),
        || async {
            let sj = env.get_sj("hello").await?;
            let st = sj.status.unwrap_or_default();
            let ran = st.history.iter().any(|h| {
                h.outcome == Outcome::Succeeded
                    && h.token.is_some_and(|t| t > before)
                    && h.start_time.as_ref().is_some_and(|t| t.0 >= resumed_at)
            });
            let not_suspended = !conditions::is_true(&st.conditions, conditions::SUSPENDED);
            Ok((ran && not_suspended).then_some(()))
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn errors_say_what_is_wrong() -> Result<()> {
    let env = Env::new("plugin-errors").await?;
    let ns = env.ns.clone();

    // An unknown name: exit 1 and the name.
    for cmd in ["status", "history", "suspend", "resume"] {
        let out = plugin(&[cmd, "nope", "-n", &ns], &[])?;
        ensure(
            &env,
            out.status.code() == Some(1)
                && stderr(&out).contains(&format!("SingletonJob {ns}/nope not found")),
            (cmd, out.status, stderr(&out)),
        )
        .await?;
    }

    // No permission: a ServiceAccount without RBAC is told which verb on which resource.
    e2e::run_ok(e2e::kubectl().args(["create", "serviceaccount", "nobody", "-n", &ns]))?;
    let kc = env.service_account_kubeconfig(&ns, "nobody")?;
    let out = plugin(&["list"], &[("KUBECONFIG", kc.as_os_str())])?;
    ensure(
        &env,
        out.status.code() == Some(1)
            && stderr(&out).contains(&format!(
                "forbidden: you may not list singletonjobs.singleton.dev in namespace {ns}"
            )),
        ("forbidden list", out.status, stderr(&out)),
    )
    .await?;
    let out = plugin(&["status", "x"], &[("KUBECONFIG", kc.as_os_str())])?;
    ensure(
        &env,
        out.status.code() == Some(1)
            && stderr(&out).contains("forbidden: you may not get singletonjobs.singleton.dev"),
        ("forbidden get", out.status, stderr(&out)),
    )
    .await?;

    // No cluster: the server refuses connections; the message points at KUBECONFIG.
    let view =
        e2e::run_ok(e2e::kubectl().args(["config", "view", "--raw", "--minify", "-o", "json"]))?;
    let mut view: serde_json::Value = serde_json::from_str(&view)?;
    view["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1".into();
    let refused = env.log_dir().join("refused.kubeconfig");
    std::fs::write(&refused, serde_json::to_vec(&view)?)?;
    let out = plugin(&["list", "-n", &ns], &[("KUBECONFIG", refused.as_os_str())])?;
    ensure(
        &env,
        out.status.code() == Some(1)
            && stderr(&out).contains("cannot reach the Kubernetes API server")
            && stderr(&out).contains("KUBECONFIG"),
        ("no cluster", out.status, stderr(&out)),
    )
    .await?;
    Ok(())
}
