//! `make demo-dr` in CI form (hack/demo-dr.sh, docs/multi-cluster.md): two control planes of its
//! own and a PostgreSQL of its own, west's API server stopped and started again, short phases.
//! The script's verdict, computed from the claims table and both clusters' Jobs, must be PASS;
//! it also requires west to run a period again within `DEMO_DR_RESUME_GRACE` seconds of its API
//! server's return (a controller blind for minutes after an outage failed here; watch_backoff.rs).
//! It starts two more control planes, so `make e2e` runs it after the other tests, alone.
//!
//! Ports: the shared cluster's (`SINGLETON_*_PORT`) plus 2000 for west and 3000 for east, and
//! PostgreSQL's plus 2000, so it runs beside `make demo-dr` (its own defaults) and `make up`.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use e2e::multicluster::DEMO_DR_PORT_OFFSETS;

fn port(var: &str, default: u16, plus: u16) -> String {
    let base = std::env::var(format!("SINGLETON_{var}"))
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(default);
    (base + plus).to_string()
}

fn ports(plus: u16) -> String {
    [
        port("ETCD_PORT", 22379, plus),
        port("ETCD_PEER_PORT", 22380, plus),
        port("APISERVER_PORT", 26443, plus),
        port("KCM_PORT", 26257, plus),
        port("SCHEDULER_PORT", 26259, plus),
    ]
    .join(" ")
}

#[test]
fn demo_dr_ends_with_a_passing_verdict() -> Result<()> {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let started = Instant::now();
    let out = Command::new(root.join("hack/demo-dr.sh"))
        .env("DEMO_DR_PERIOD", "5")
        .env("DEMO_DR_PHASE_SECONDS", "15")
        // Under a loaded CI machine west's claim can take more than the demo's 2 s.
        .env("DEMO_DR_STANDBY_DELAY", "3")
        .env("DEMO_DR_TAKEOVER_AFTER", "6")
        .env("DEMO_DR_RESUME_GRACE", "15")
        .env("DEMO_DR_KEEP", "0")
        .env("DEMO_DR_WEST_PORTS", ports(DEMO_DR_PORT_OFFSETS[0]))
        .env("DEMO_DR_EAST_PORTS", ports(DEMO_DR_PORT_OFFSETS[1]))
        .env(
            "DEMO_DR_PG_PORT",
            port("PG_PORT", 25432, DEMO_DR_PORT_OFFSETS[0]),
        )
        .output()
        .context("run hack/demo-dr.sh")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let verdict = stdout.lines().find(|l| l.starts_with("VERDICT:"));
    println!(
        "demo-dr in {:.0?}: {}",
        started.elapsed(),
        verdict.unwrap_or("<no verdict>")
    );
    ensure!(
        out.status.success() && verdict.is_some_and(|v| v.starts_with("VERDICT: PASS")),
        "hack/demo-dr.sh exited {}; its output:\n{stdout}\n{stderr}",
        out.status
    );
    Ok(())
}
