//! The chart on the real node (hack/node.sh: kubelet, containerd, runc): the controller image
//! built by `make image` runs as the chart's two pods in a namespace enforcing the `restricted`
//! Pod Security Standard; they elect a leader; a SingletonJob's Job runs the billing workload's
//! real container, which writes its period and fencing token to PostgreSQL in a transaction that
//! calls `singleton_fence`; the probes and `/metrics` answer on the pod IP; deleting the leader
//! pod hands the Lease over and the next period runs under the new leader with a newer token.
//!
//! The billing workload's Go and Python ports run there too, as SingletonJobs of a controller the
//! test runs on this host.
//!
//! Needs the real node (`make up`, unless SINGLETON_REAL_NODE=0) and the images (`make image`,
//! which `make e2e` runs): without them this test fails and says so; it never passes vacuously.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::ports::{
    all_finished, committed, exit_of, logs, port, rejections, rerun_by_hand, succeeded_runs,
    suspend,
};
use e2e::{Env, ensure, https_get, kubectl, run_ok, token_of};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};

use e2e::real_node::*;

const EVERY_MINUTE: &str = "* * * * *";

/// An assertion on what the test saw (not `e2e::ensure`: it refuses the chart's controllers).
async fn check(_env: &Env, ok: bool, what: impl std::fmt::Debug) -> Result<()> {
    anyhow::ensure!(ok, "assertion failed: {what:?}");
    Ok(())
}

/// Removes the test's ClusterRoleBinding (cluster-scoped: its namespace's deletion does not).
struct Binding(String);
impl Drop for Binding {
    fn drop(&mut self) {
        let _ = kubectl()
            .args([
                "delete",
                "clusterrolebinding",
                &self.0,
                "--ignore-not-found",
            ])
            .output();
    }
}

#[tokio::test]
async fn chart_runs_real_pods_and_a_fenced_workload() -> Result<()> {
    let Setup {
        env,
        work,
        release,
        full,
        host_url,
        _uninstall,
    } = setup("real-node").await?;
    // Two real pods on the real node, and one of them leads.
    let pods = wait(
        "two Ready controller pods",
        Duration::from_secs(120),
        &[&env.ns],
        || async {
            let p = ready_pods(&env, &release).await?;
            Ok((p.len() == 2).then_some(p))
        },
    )
    .await?;
    for (name, _) in &pods {
        let pod = Api::<Pod>::namespaced(env.client.clone(), &env.ns)
            .get(name)
            .await?;
        let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        check(&env, node == NODE, ("pod", name, "on node", &node)).await?;
    }
    // The Lease is named after the release; its holder is "<pod name>-<random>" (--instance).
    let holder = wait(
        "the Lease to be held",
        Duration::from_secs(60),
        &[&env.ns],
        || async { lease_holder(&env, &release).await },
    )
    .await?;
    let (leader, leader_ip) = pods
        .iter()
        .find(|(n, _)| holder.starts_with(&format!("{n}-")))
        .cloned()
        .with_context(|| format!("Lease holder {holder} is none of the pods {pods:?}"))?;

    // The probes answer on each pod's IP (plain HTTP, no token) ...
    for (name, ip) in &pods {
        for path in ["/healthz", "/readyz"] {
            let r = e2e::http_get(SocketAddr::new(*ip, 8080), path).await?;
            check(&env, r.status == 200, (name, path, r.status, &r.body)).await?;
        }
    }
    // ... and /metrics over HTTPS: refused without a token, served to a metrics reader.
    let metrics = SocketAddr::new(leader_ip, 8443);
    let none = https_get(metrics, "/metrics", None).await?;
    check(
        &env,
        none.status == 401,
        ("/metrics without a token", none.status),
    )
    .await?;
    run_ok(kubectl().args(["create", "serviceaccount", "scraper", "-n", &env.ns]))?;
    let binding = Binding(format!("{}-scraper", env.ns));
    run_ok(kubectl().args([
        "create",
        "clusterrolebinding",
        &binding.0,
        &format!("--clusterrole={full}-metrics-reader"),
        &format!("--serviceaccount={}:scraper", env.ns),
    ]))?;
    let token = run_ok(kubectl().args(["create", "token", "scraper", "-n", &env.ns]))?;
    let body = wait(
        "/metrics for the reader",
        Duration::from_secs(40),
        &[&env.ns],
        || async {
            let r = https_get(metrics, "/metrics", Some(token.trim())).await?;
            Ok((r.status == 200).then_some(r.body))
        },
    )
    .await?;
    check(
        &env,
        body.contains("singleton_leader"),
        ("metrics text", &body),
    )
    .await?;

    // A run: the Job's real container writes its period and token, fenced.
    work.create_sj(&billing_sj(EVERY_MINUTE, "Forbid", 0))
        .await?;
    let (job1, period1, token1) = next_completed_job(&work, &[]).await?;
    let written = runs_written(&host_url).await?;
    check(
        &work,
        written.contains(&(period1.clone(), token1 as i64)),
        ("invoice_runs", &written, "Job", &job1, &period1, token1),
    )
    .await?;
    let logs = run_ok(kubectl().args(["logs", &format!("job/{job1}"), "-n", &work.ns]))?;
    check(
        &work,
        logs.contains(&format!("fencing token {token1}")) && logs.contains("committed"),
        ("kubectl logs of the run", &logs),
    )
    .await?;

    // Deleting the leader pod hands over: another pod takes the Lease and runs the next period
    // with a newer token.
    Api::<Pod>::namespaced(env.client.clone(), &env.ns)
        .delete(&leader, &DeleteParams::default())
        .await?;
    let new_leader = another_holder(
        &env,
        &release,
        &leader,
        "another pod to take the Lease",
        Duration::from_secs(90),
    )
    .await?;
    let (job2, period2, token2) = next_completed_job(&work, std::slice::from_ref(&job1)).await?;
    check(
        &work,
        token2 > token1 && period2 > period1,
        (
            "after handover",
            &new_leader,
            &job2,
            &period2,
            token2,
            "before",
            &period1,
            token1,
        ),
    )
    .await?;
    let written = runs_written(&host_url).await?;
    check(
        &work,
        written.contains(&(period2.clone(), token2 as i64)),
        ("invoice_runs after handover", &written),
    )
    .await?;
    drop(binding);
    Ok(())
}

/// The stale-run case on real containers: a run's container is frozen with the cgroup freezer
/// (a VM or GC pause) before its write; the next period Replaces it, which advances the fence to
/// a newer token before the old Job is deleted; thawed, the old run goes on to its transaction
/// (it finishes a run on SIGTERM) and `singleton_fence` refuses it with SQLSTATE SF001, so
/// nothing of it commits; the newer run's write commits.
#[tokio::test]
async fn frozen_workload_is_refused_by_the_fence_after_a_replace() -> Result<()> {
    let Setup {
        env: _env,
        work,
        host_url,
        _uninstall,
        ..
    } = setup("real-freeze").await?;
    // 50 s of "work": the first run is still before its write when the next minute's period
    // replaces it.
    work.create_sj(&billing_sj(EVERY_MINUTE, "Replace", 50))
        .await?;
    let job1 = wait(
        "the first run's Job",
        Duration::from_secs(90),
        &[&work.ns],
        || async {
            Ok(work
                .jobs()
                .list(&ListParams::default())
                .await?
                .into_iter()
                .next())
        },
    )
    .await?;
    let (job1_name, token1) = (job1.name_any(), token_of(&job1));
    let (pod1, container1) = running_pod_of(&work, &job1_name).await?;
    // Its log, streamed from now until its container ends (the pod is deleted right after).
    let log_path = work.log_dir().join("frozen-run.log");
    let mut follow = kubectl()
        .args(["logs", "-f", &pod1, "-n", &work.ns])
        .stdout(std::fs::File::create(&log_path)?)
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let cgroup = freezer_of(&container1)?;
    set_freezer(&cgroup, "FROZEN").await?;

    // The next period replaces it: the fence moves past its token while it is frozen.
    let host = host_url.clone();
    let fence = wait(
        "the fence to move past the frozen run's token",
        Duration::from_secs(120),
        &[&work.ns],
        || async {
            let (client, conn) = tokio_postgres::connect(&host, tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            let row = client
                .query_opt("SELECT max(token) FROM singleton_fences", &[])
                .await
                .ok()
                .flatten();
            let t: Option<i64> = row.and_then(|r| r.get(0));
            Ok(t.filter(|t| *t > token1 as i64))
        },
    )
    .await;
    // Thawed whatever happened, so a failure leaves no frozen process behind.
    set_freezer(&cgroup, "THAWED").await?;
    let fence = fence?;

    // Thawed, it goes on to its transaction and is refused by the fence.
    let refused = wait(
        "the thawed run's write to be refused",
        Duration::from_secs(60),
        &[&work.ns],
        || async {
            let log = std::fs::read_to_string(&log_path)?;
            Ok(log.contains("SQLSTATE SF001").then_some(log))
        },
    )
    .await?;
    let _ = follow.kill();
    let written = runs_written(&host_url).await?;
    check(
        &work,
        !written.iter().any(|(_, t)| *t == token1 as i64),
        ("the stale run wrote", &written, "its log", &refused),
    )
    .await?;
    // The newer run, created once the old pod is gone, commits with the newer token.
    let (job2, period2, token2) =
        next_completed_job(&work, std::slice::from_ref(&job1_name)).await?;
    check(
        &work,
        token2 as i64 == fence,
        ("newer run", &job2, token2, "fence", fence),
    )
    .await?;
    let written = runs_written(&host_url).await?;
    check(
        &work,
        written.contains(&(period2.clone(), token2 as i64)),
        ("invoice_runs", &written),
    )
    .await?;
    Ok(())
}

/// The leader's container frozen with the cgroup freezer past its Lease (the realistic VM or GC
/// pause): the standby takes the Lease while it is frozen; thawed, the old leader stays out (the
/// Lease stays with the new one) and the runs go on with rising tokens, one Job per period.
#[tokio::test]
async fn frozen_leader_loses_the_lease_and_stays_out() -> Result<()> {
    let Setup {
        env,
        work,
        release,
        _uninstall,
        ..
    } = setup("real-lfreeze").await?;
    work.create_sj(&billing_sj(EVERY_MINUTE, "Forbid", 0))
        .await?;
    let (job1, _, token1) = next_completed_job(&work, &[]).await?;

    let (leader, id) = leader_container(&env, &release).await?;
    let cgroup = freezer_of(&id)?;
    set_freezer(&cgroup, "FROZEN").await?;
    // The Lease (15 s) runs out while it is frozen; thawed right after the takeover, before the
    // liveness probe (3 failures 10 s apart) would restart it.
    let taken = another_holder(
        &env,
        &release,
        &leader,
        "the standby to take the Lease from the frozen leader",
        Duration::from_secs(40),
    )
    .await;
    set_freezer(&cgroup, "THAWED").await?;
    let new_holder = taken?;

    // Thawed, the old leader does not take the Lease back, and the next run comes from the new
    // leader with a higher token.
    let (job2, _, token2) = next_completed_job(&work, std::slice::from_ref(&job1)).await?;
    let now = lease_holder(&env, &release).await?;
    check(
        &env,
        now.as_deref() == Some(new_holder.as_str()) && token2 > token1,
        (
            "holder",
            &now,
            "new",
            &new_holder,
            "tokens",
            token1,
            &job2,
            token2,
        ),
    )
    .await?;
    // One Job per period, tokens rising with the periods.
    let mut jobs: Vec<(String, u64)> = work
        .jobs()
        .list(&ListParams::default())
        .await?
        .iter()
        .filter_map(|j| Some((period_of(j)?, token_of(j))))
        .collect();
    jobs.sort();
    let unique = jobs.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1);
    check(&work, unique, ("Jobs (period, token)", &jobs)).await?;
    Ok(())
}

/// The README's commands after `make demo`, run as written in a shell that has nothing but what
/// `make env` gives it (`env -i`, `PATH=/usr/bin:/bin`): kubectl, its plugin and the cluster come
/// from `eval "$(make -s env)"`. What `make demo` sets up with the real node is set up here (the
/// chart with the local images, the billing database and Secret), the demo's SingletonJob
/// (examples/billing/demo.yaml) runs, and the demo's namespace becomes this test's.
#[tokio::test]
async fn the_readmes_commands_after_make_demo_run_in_a_clean_shell() -> Result<()> {
    // `_uninstall` kept: dropping it uninstalls the chart.
    let Setup {
        env,
        work,
        _uninstall,
        ..
    } = setup("readme").await?;
    let demo = std::fs::read_to_string(e2e::repo_file("examples/billing/demo.yaml"))?;
    // The image tag the demo applies: this build's version (hack/demo.sh does the same).
    let demo: String = demo
        .lines()
        .map(|l| match l.split_once("billing-workload:") {
            Some((head, _)) => format!("{head}billing-workload:{VERSION}\n"),
            None => format!("{l}\n"),
        })
        .collect();
    work.create_sj(&demo).await?;
    let (job, _, token) = next_completed_job(&work, &[]).await?;

    let readme = std::fs::read_to_string(e2e::repo_file("README.md"))?;
    let after = readme
        .split_once("After `make demo`")
        .map(|(_, rest)| rest)
        .context("the README has its \"After `make demo`\" paragraph")?;
    let block = e2e::sh_blocks(after)
        .into_iter()
        .next()
        .context("a ```sh block after it")?;
    let script = block.script.replace("singleton-demo", &work.ns);
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    // A new shell of a user who has the README's prerequisites (Go, cargo) on its PATH, and
    // nothing this session exported.
    let path = prerequisites_path()?;
    let out = std::process::Command::new("env")
        .args(["-i", &format!("HOME={home}"), &format!("PATH={path}")])
        .args(["bash", "-euo", "pipefail", "-c", &script])
        .current_dir(e2e::repo_file(""))
        .output()?;
    let (text, err) = (e2e::stdout(&out), e2e::stderr(&out));
    check(
        &env,
        out.status.success()
            && text.contains("invoices")
            && text.contains("Succeeded")
            && text.contains("Fencing Token")
            && text.contains("committed 3 invoice(s)"),
        (
            "README block at its line",
            block.line,
            &script,
            "first run",
            &job,
            token,
            &text,
            &err,
        ),
    )
    .await?;
    Ok(())
}

/// `/usr/bin:/bin` and the directories of the README's prerequisites `go` and `cargo`, as found
/// on this process's PATH.
fn prerequisites_path() -> Result<String> {
    let mut dirs: Vec<String> = Vec::new();
    for tool in ["go", "cargo"] {
        let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .find(|d| d.join(tool).is_file())
            .with_context(|| format!("{tool} (a prerequisite) is not on PATH"))?;
        dirs.push(found.display().to_string());
    }
    dirs.extend(["/usr/bin".to_string(), "/bin".to_string()]);
    Ok(dirs.join(":"))
}

/// The billing workload's Go and Python ports (examples/billing/go, examples/billing/python; their
/// images from `hack/image.sh workload-go workload-python`) as two SingletonJobs on the real node,
/// each with a database of its own, served by a controller this test runs on this host. Each
/// port commits every run it made once, under that run's token: one ledger row and three invoices
/// per period, nothing else. Then a run of each is started again by hand (its Job copied, with the
/// token the controller gave it, older than the fence now): the fence refuses it, it exits 3 and
/// writes nothing.
#[tokio::test]
async fn go_and_python_workloads_commit_once_and_a_stale_rerun_exits_3() -> Result<()> {
    let mut env = Env::new("real-ports").await?;
    real_node_ready(&env).await?;
    restricted(&env.ns)?;
    let ports = [port(&env, "go").await?, port(&env, "python").await?];
    env.start_controller(&[]).await?;
    for p in &ports {
        env.create_sj(&p.singleton_job("*/3 * * * * *")).await?;
    }
    // A few runs of each, then no new ones, and the one under way (if any) ended.
    env.wait_for(
        "three succeeded runs of each port",
        Duration::from_secs(60),
        || async {
            for p in &ports {
                if succeeded_runs(&env, &p.sj).await?.len() < 3 {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    for p in &ports {
        suspend(&env, &p.sj).await?;
    }
    env.wait_for(
        "the runs under way to end",
        Duration::from_secs(60),
        || async { Ok(all_finished(&env).await?.then_some(())) },
    )
    .await?;

    // Each run committed once under its token (its ledger row, its three invoices); nothing else.
    let mut before = Vec::new();
    for p in &ports {
        let runs = succeeded_runs(&env, &p.sj).await?;
        let want: BTreeMap<(String, i64), (i64, i64)> = runs
            .iter()
            .map(|(_, period, token)| ((period.clone(), *token as i64), (1, 3)))
            .collect();
        let got = committed(&p.host_url).await?;
        let log = logs(&env, &runs[0].0);
        ensure(
            &env,
            got == want && log.contains("committed 3 invoice(s)"),
            (
                p.lang,
                "committed",
                &got,
                "runs",
                &runs,
                "first run's log",
                &log,
            ),
        )
        .await?;
        rerun_by_hand(&env, &runs[0].0, &format!("stale-{}", p.lang)).await?;
        before.push((got, rejections(&p.host_url).await?, runs[0].clone()));
    }
    // The runs started by hand: refused by the fence (SF001), exit code 3, nothing written.
    for (p, (rows, refused, first)) in ports.iter().zip(before) {
        let (code, log) = exit_of(&env, &format!("stale-{}", p.lang)).await?;
        let (now, refused_now) = (
            committed(&p.host_url).await?,
            rejections(&p.host_url).await?,
        );
        ensure(
            &env,
            code == 3 && log.contains("SQLSTATE SF001") && now == rows && refused_now > refused,
            (
                p.lang,
                "rerun of",
                &first,
                "exit",
                code,
                &log,
                "rows",
                &now,
                "refusals",
                refused_now,
            ),
        )
        .await?;
    }
    for p in &ports {
        p.drop_database().await?;
    }
    Ok(())
}
