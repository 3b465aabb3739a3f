//! The fault-injection suite (issue #8, docs/reliability.md): every scenario of
//! `e2e::chaos::all_scenarios()`, one after another, against the shared cluster; the two-cluster
//! `dr-*` ones last, with the second control plane of e2e/src/multicluster.rs. It restarts the
//! API server, etcd and PostgreSQL, so `make e2e` runs it after the other tests, alone; `make
//! chaos` runs it with `CHAOS=full`. `CHAOS_SCENARIOS=leader-sigstop,partition` picks scenarios
//! by name. The table is printed and written to `CHAOS_REPORT` (make sets it under target/).

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
        _ => all,
    };
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
