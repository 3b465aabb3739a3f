//! Runs docs/operations.md: every ```sh block, in order and as written, with kubectl and the
//! plugin on PATH, against a controller and a SingletonJob like the runbook's. A block preceded by
//! `<!-- runbook: not run here; ... -->` names the test that runs it instead. The namespaces of
//! the runbook (`billing` for the SingletonJob, `singleton-system` for the Lease) become this
//! test's namespace; nothing else is changed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::{
    Env, backstop_secret, backstop_spec, database_url, ensure, plugin_bin, repo_file, sh_blocks,
    sj_yaml, stderr, stdout, table_prefix,
};

/// PATH with the cached kubectl and the built plugin first, as a user would have them.
fn path_with_tools() -> Result<std::ffi::OsString> {
    let kubectl = PathBuf::from(std::env::var("KUBECTL").context("KUBECTL is set by make e2e")?);
    let dirs = [
        kubectl.parent().map(Path::to_path_buf),
        plugin_bin().parent().map(Path::to_path_buf),
    ];
    let rest = std::env::var_os("PATH").unwrap_or_default();
    let mut all: Vec<PathBuf> = dirs.into_iter().flatten().collect();
    all.extend(std::env::split_paths(&rest));
    Ok(std::env::join_paths(all)?)
}

#[test]
fn blocks_are_found_and_skips_honoured() {
    let md = "text\n```sh\na\nb\n```\n<!-- runbook: not run here; x -->\n```sh\nskipped\n```\n```text\nout\n```\n```sh\nc\n```\n";
    let blocks = sh_blocks(md);
    let scripts: Vec<&str> = blocks.iter().map(|b| b.script.as_str()).collect();
    assert_eq!(scripts, ["a\nb", "c"]);
    assert_eq!(blocks[0].line, 2);
}

#[tokio::test]
async fn the_operations_runbook_runs_as_written() -> Result<()> {
    let mut env = Env::new("runbook").await?;
    let ns = env.ns.clone();
    let prefix = table_prefix(&env);
    backstop_secret(&env, "billing-db", &database_url()?, true).await?;
    env.start_controller(&[
        "--leader-elect",
        "--lease-name",
        "singleton-controller",
        "--lease-namespace",
        &ns,
    ])
    .await?;
    // The billing example's schedule and backstop, on the test's database.
    env.create_sj(&sj_yaml(
        "invoices",
        "0 3 1 * *",
        &backstop_spec(
            "billing-db",
            &prefix,
            "  timeZone: Europe/Berlin\n  successfulJobsHistoryLimit: 100\n",
        ),
    ))
    .await?;
    env.wait_for(
        "invoices to be decided",
        Duration::from_secs(30),
        || async {
            let st = env.get_sj("invoices").await?.status.unwrap_or_default();
            Ok(st.decided_through.map(|_| ()))
        },
    )
    .await?;

    let text = std::fs::read_to_string(repo_file("docs/operations.md"))?;
    let blocks = sh_blocks(&text);
    let path = path_with_tools()?;
    let mut outputs = Vec::new();
    for b in &blocks {
        let script = b
            .script
            .replace("-n billing", &format!("-n {ns}"))
            .replace("-n singleton-system", &format!("-n {ns}"));
        let out = std::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", &script])
            .env("PATH", &path)
            .output()
            .with_context(|| format!("running the block at docs/operations.md:{}", b.line))?;
        ensure(
            &env,
            out.status.success(),
            (
                format!("docs/operations.md:{}", b.line),
                &script,
                stdout(&out),
                stderr(&out),
            ),
        )
        .await?;
        outputs.push((b.script.clone(), stdout(&out)));
    }

    // What the runbook's text says each command prints.
    let said = |cmd: &str| -> Vec<&str> {
        outputs
            .iter()
            .filter(|(s, _)| s.contains(cmd))
            .map(|(_, o)| o.as_str())
            .collect()
    };
    let expect: [(&str, &[&str]); 7] = [
        ("kubectl get sj", &["invoices", "0 3 1 * *"]),
        (
            "singleton rerun",
            &[
                "re-ran period 2026-09-01T01:00:00Z: started Job invoices-1788224400-r",
                "the period's backstop claim moved from token",
            ],
        ),
        (
            "singleton status",
            &["Backstop:", "Fencing Token:", "History"],
        ),
        ("singleton trigger", &["triggered: started Job invoices-"]),
        (
            "singleton suspend",
            &["suspended (spec.suspend: false -> true)"],
        ),
        (
            "singleton break-lock",
            &["lock broken: fencing token raised from"],
        ),
        ("get lease", &["e2e-0"]),
    ];
    for (cmd, wants) in expect {
        let outs = said(cmd);
        ensure(
            &env,
            !outs.is_empty() && wants.iter().all(|w| outs.iter().any(|o| o.contains(w))),
            (cmd, wants, &outs),
        )
        .await?;
    }
    let backfills = said("singleton backfill");
    ensure(
        &env,
        backfills.len() == 2
            && backfills[0].contains("started 3 run(s); 0 period(s) had run before")
            && backfills[1].contains("started 0 run(s); 3 period(s) had run before"),
        ("the backfill, twice", &backfills),
    )
    .await?;
    Ok(())
}
