//! The fault-injection suite (issue #8, docs/reliability.md): every scenario of
//! `e2e::chaos::all_scenarios()`, one after another, against the shared cluster; the two-cluster
//! `dr-*` ones last, with the second control plane of e2e/src/multicluster.rs. Some restart the
//! API server, etcd and PostgreSQL, so `make e2e` runs those alone (hack/e2e.sh); `make chaos`
//! runs them all, one after another, with `CHAOS=full`. `CHAOS_SCENARIOS=leader-sigstop,partition` picks scenarios
//! by name, `CHAOS_SCOPE=namespace` by what they touch (`Fault::scope`), `CHAOS_SHARD=2/3` every
//! third of those from the second on: hack/e2e.sh runs what shares nothing side by side. The
//! table is printed and written to `CHAOS_REPORT` (make sets it under target/).

use anyhow::{Result, bail};
use e2e::chaos::{Fault, Mode, all_scenarios, run_all};

#[tokio::test]
async fn chaos_suite() -> Result<()> {
    let mode = Mode::from_env();
    let all = all_scenarios();
    let chosen: Vec<Fault> = match std::env::var("CHAOS_SCENARIOS") {
        Ok(names) if !names.trim().is_empty() => {
            let names: Vec<&str> = names.split(',').map(str::trim).collect();
            for n in &names {
                if !all.iter().any(|f| f.name() == *n) {
                    bail!("unknown scenario {n:?}");
                }
            }
            all.into_iter()
                .filter(|f| names.contains(&f.name()))
                .collect()
        }
        // hack/e2e.sh runs the scopes that share nothing side by side.
        _ => match std::env::var("CHAOS_SCOPE") {
            Ok(scope) if !scope.trim().is_empty() => {
                let scope = scope.trim();
                let chosen: Vec<Fault> = all
                    .into_iter()
                    .filter(|f| f.scope().name() == scope)
                    .collect();
                if chosen.is_empty() {
                    bail!(
                        "CHAOS_SCOPE={scope:?} names no scenario's scope (namespace, cluster, real-nodes, second-cluster)"
                    );
                }
                chosen
            }
            _ => all,
        },
    };
    let chosen = shard(chosen)?;
    let (outcomes, report) = run_all(&chosen, mode).await?;
    println!("\n{report}");
    if let Some(path) = std::env::var_os("CHAOS_REPORT") {
        let path = std::path::PathBuf::from(path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, &report)?;
    }
    let violations: Vec<String> = outcomes.into_iter().flat_map(|o| o.violations).collect();
    if !violations.is_empty() {
        bail!("chaos checks failed:\n{}", violations.join("\n"));
    }
    Ok(())
}

/// `CHAOS_SHARD=i/n`: the i-th of every n scenarios (1-based), for side-by-side processes.
fn shard(chosen: Vec<Fault>) -> Result<Vec<Fault>> {
    let Ok(spec) = std::env::var("CHAOS_SHARD") else {
        return Ok(chosen);
    };
    let parsed = spec.split_once('/').and_then(|(i, n)| {
        Some((
            i.trim().parse::<usize>().ok()?,
            n.trim().parse::<usize>().ok()?,
        ))
    });
    let Some((i, n)) = parsed.filter(|(i, n)| (1..=*n).contains(i)) else {
        bail!("CHAOS_SHARD={spec:?}: expected i/n with 1 <= i <= n, e.g. 1/2");
    };
    Ok(chosen
        .into_iter()
        .enumerate()
        .filter(|(k, _)| k % n == i - 1)
        .map(|(_, f)| f)
        .collect())
}
