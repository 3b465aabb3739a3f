//! Upgrades and rollbacks never run a period twice (issue 36, item 3).
//!
//! The previous release (hack/previous-release: a tag of this repository, built from its own
//! history by hack/previous-release.sh and cached; `SINGLETON_PREVIOUS_RELEASE` is its
//! directory) is installed with its own chart and CRD and runs a burst of fenced SingletonJobs
//! due every few seconds. Then, each time in the middle of a burst (a quarter of its Jobs
//! created), the cluster goes through what an upgrade and a rollback do to it:
//!
//! 1. upgrade: `helm upgrade` to this tree's chart (its CRD, RBAC, Deployment), a replica of
//!    this tree started, the old leader stopped by SIGTERM: the Lease passes old → new;
//! 2. rollback: `helm upgrade` to the previous release's chart (which keeps the newer CRD: checked;
//!    `helm rollback` would replay the old CRD and prune the newer fields), a replica of the
//!    previous release started, the new leader frozen (SIGSTOP) past its Lease: new → old; the
//!    frozen one is resumed once the old one has run a burst, with whatever it had in flight;
//! 3. upgrade again: `helm upgrade`, a replica of this tree, the old leader killed (SIGKILL):
//!    old → new.
//!
//! Counted from outside: a watch of the namespace's Jobs (no period with two Jobs that ran), the
//! database's rows (at most one attempt per period committed, none overlapping: each Job that
//! ran gets a simulated pod that registers as its run's attempt and commits a fenced write), and
//! every period due while it all happened either ran or was recorded with a reason in the
//! SingletonJob's history (none lost).
//!
//! The backstop's schema is migrated forward in place by the first newer controller that
//! connects, while older ones may still be running and claiming. A second course starts from the
//! last build with the previous schema (`SINGLETON_OLDER_SCHEMA`, hack/previous-release's
//! `schema-6`: no release has had an older schema yet): it runs the burst, a controller of this
//! tree in another namespace migrates the same tables mid-burst, the older one goes on claiming
//! against the migrated schema for two more bursts, then hands over to this tree's; counted the
//! same way.
//!
//! The controllers run as processes beside the chart (its Deployment scaled to 0), as the
//! chart's ServiceAccount: the chart's objects and the CRD go through helm as a user's would,
//! each replica runs under the RBAC the chart installed when it started, and the processes
//! stand for the Deployment's pods of each release during its rolling update. The cluster's
//! CRD is the chart's here, so `make e2e` runs this on a control plane of its own
//! (hack/own-cluster.sh, instance own4).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use e2e::chaos::check::AttemptVerdict;
use e2e::sim_pods::SimulatedPods;
use e2e::{
    Env, STEADY_ELECTION, backstop_secret, backstop_spec, chart_dir, database_url, ensure, helm,
    kubectl, pg, run_ok, sj_yaml, table_prefix,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams};
use singleton::api::Outcome;

/// The Helm release, and the Lease its chart's Role lets the ServiceAccount take (the
/// release's name).
const RELEASE: &str = "sc-upgrade";
const LEASE_NAME: &str = RELEASE;
/// SingletonJobs in the burst, all due at every instant of [`SCHEDULE`].
const BURST: usize = 12;
/// Every five seconds: a burst falls due in every phase, and a handover (a ten-second Lease when
/// the leader is killed or frozen) spans two or three instants.
const SCHEDULE: &str = "*/5 * * * * *";
const EVERY: i64 = 5;
const CRDS: [&str; 2] = [
    "singletonjobs.singleton.dev",
    "singletoncalendars.singleton.dev",
];

/// The courses change the CRDs and share the control plane: one at a time.
static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An older build's directory (`var`: SINGLETON_PREVIOUS_RELEASE, the previous release, or
/// SINGLETON_OLDER_SCHEMA): its controller binary, chart and CRDs.
fn older(var: &str, name: &str) -> Result<PathBuf> {
    let dir = std::env::var_os(var).with_context(|| {
        format!(
            "{var} is not set: `make e2e` sets it (hack/previous-release.sh build {name} prints it)"
        )
    })?;
    let dir = PathBuf::from(dir);
    for part in ["singleton-controller", "chart/Chart.yaml", "RELEASE"] {
        if !dir.join(part).exists() {
            bail!(
                "{} has no {part}: rebuild it with hack/previous-release.sh build",
                dir.display()
            );
        }
    }
    Ok(dir)
}

fn elect() -> Vec<&'static str> {
    [STEADY_ELECTION, &["--lease-name", LEASE_NAME]].concat()
}

/// Runs helm against the test's cluster, in its namespace; its output.
fn helm_run(env: &Env, args: &[&str]) -> Result<String> {
    let mut cmd = helm();
    cmd.args(args).args(["--namespace", &env.ns]);
    run_ok(&mut cmd)
}

/// `helm install` or `helm upgrade` of `chart` as the release `name`: the CRD with it, the
/// Deployment at 0 replicas (the processes stand for its pods), the test's namespace granted
/// its backstop Secret, and the admission policies on (this control plane is the test's own)
/// but for the release namespace's protection: the workloads run there.
fn helm_apply(env: &Env, verb: &str, name: &str, chart: &std::path::Path) -> Result<String> {
    let chart = chart.to_string_lossy();
    // The backstop Secret's namespace granted, as its admin would (the chart's opt-in).
    let secrets = format!("rbac.backstopNamespaces={{{}}}", env.ns);
    helm_run(
        env,
        &[
            verb,
            name,
            &chart,
            "--set",
            &secrets,
            "--set",
            "replicaCount=0",
            // The workloads run in the release's namespace here (one namespace per test).
            "--set",
            "admissionPolicies.protectReleaseNamespace=false",
            "--wait",
            "--timeout",
            "120s",
        ],
    )
}

/// Removes the CRDs `make e2e` applied (and with them every SingletonJob of this control
/// plane, which is this test's alone), so the previous release's chart installs its own.
async fn remove_crds(env: &Env) -> Result<()> {
    // A CRD deleted while its storage still initializes (make e2e applied it a moment ago, on
    // a loaded machine) fails the API server's cleanup ("storage is (re)initializing", seen in
    // its log) and is retried with a growing backoff, past this test's wait: first both kinds
    // answer a list.
    env.wait_for(
        "the CRDs' storage to serve",
        Duration::from_secs(60),
        || async {
            let jobs: Api<singleton::api::SingletonJob> = Api::all(env.client.clone());
            let calendars: Api<singleton::api::SingletonCalendar> = Api::all(env.client.clone());
            let one = kube::api::ListParams::default().limit(1);
            jobs.list(&one).await?;
            calendars.list(&one).await?;
            Ok(Some(()))
        },
    )
    .await?;
    let api: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    for name in CRDS {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    env.wait_for("the CRDs to be gone", Duration::from_secs(60), || async {
        for name in CRDS {
            if api.get_opt(name).await?.is_some() {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
}

/// Waits until the SingletonJob CRD is served with `version` as its chart label.
async fn crd_at(env: &Env, version: &str) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    env.wait_for(
        &format!("the CRD established, from the chart of {version}"),
        Duration::from_secs(60),
        || async {
            let Some(crd) = api.get_opt(CRDS[0]).await? else {
                return Ok(None);
            };
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            let labelled = crd
                .metadata
                .labels
                .unwrap_or_default()
                .get("app.kubernetes.io/version")
                == Some(&version.to_string());
            Ok((established && labelled).then_some(()))
        },
    )
    .await
}

/// Whether the installed SingletonJob CRD's schema has a property named `field`.
async fn crd_has_field(env: &Env, field: &str) -> Result<bool> {
    let api: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let crd = api.get(CRDS[0]).await?;
    Ok(serde_json::to_string(&crd.spec)?.contains(&format!("\"{field}\":")))
}

/// The next instant of [`SCHEDULE`] after `t`.
fn next_instant(t: Timestamp) -> Result<Timestamp> {
    let s = t.as_second();
    Ok(Timestamp::from_second(s - s.rem_euclid(EVERY) + EVERY)?)
}

/// Waits for the next burst to be under way: a quarter of its Jobs exist. Returns its instant.
async fn mid_burst(env: &Env, pods: &SimulatedPods) -> Result<Timestamp> {
    let at = next_instant(Timestamp::now())?;
    env.wait_for(
        &format!("a quarter of the burst at {at} created"),
        Duration::from_secs(30),
        || async {
            let n = pods
                .watch
                .jobs()
                .iter()
                .filter(|j| j.period == Some(at))
                .count();
            Ok((n >= BURST / 4).then_some(at))
        },
    )
    .await
}

/// Waits until every SingletonJob ran a period after `after` (a whole burst under the current
/// leader).
async fn burst_ran_after(env: &Env, pods: &SimulatedPods, after: Timestamp) -> Result<()> {
    env.wait_for(
        &format!("every SingletonJob to run a period after {after}"),
        Duration::from_secs(60),
        || async {
            let ran: BTreeSet<String> = pods
                .watch
                .jobs()
                .into_iter()
                .filter(|j| j.ran && j.period.is_some_and(|p| p > after))
                .filter_map(|j| j.sj)
                .collect();
            Ok((ran.len() == BURST).then_some(()))
        },
    )
    .await
}

/// Waits until controller `idx` holds the Lease.
async fn leads(env: &Env, idx: usize) -> Result<()> {
    env.wait_for(
        &format!("controller {idx} to lead"),
        Duration::from_secs(30),
        || async { Ok((env.lease_holder(LEASE_NAME).await? == Some(idx)).then_some(())) },
    )
    .await
}

/// What the outside saw of the periods due in `[from, to]`.
#[derive(Debug)]
struct Counted {
    /// Periods with two Jobs that ran (the watch).
    seconds: Vec<Vec<e2e::observer::JobRecord>>,
    relists: u64,
    /// Committed attempts per period (the database's rows).
    attempts: AttemptVerdict,
    started: usize,
    committed: usize,
    ran: usize,
    recorded: Vec<String>,
    lost: Vec<String>,
}

impl Counted {
    async fn take(
        env: &Env,
        pods: &SimulatedPods,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Counted> {
        let seconds = pods.watch.second_runs();
        let (attempts, started, committed) = pods.verdict().await?;
        let (ran, recorded, lost) = account(env, pods, from, to).await?;
        Ok(Counted {
            seconds,
            relists: pods.watch.relists(),
            attempts,
            started,
            committed,
            ran,
            recorded,
            lost,
        })
    }

    /// One Job and at most one committed attempt per period, none overlapping, none lost.
    fn clean(&self) -> bool {
        self.seconds.is_empty()
            && self.relists == 0
            && self.attempts.max <= 1
            && self.attempts.overlapping == 0
            && self.lost.is_empty()
    }

    fn summary(&self) -> String {
        format!(
            "{} periods ran, {} recorded without a run {:?}, {} lost; attempts committed per period (max) {}, overlapping {}; pods started {}, committed {}",
            self.ran,
            self.recorded.len(),
            self.recorded,
            self.lost.len(),
            self.attempts.max,
            self.attempts.overlapping,
            self.started,
            self.committed
        )
    }
}

/// Every period of every SingletonJob due in `[from, to]`: ran (the watch), recorded in its
/// history (with the outcome and reason), or lost. Returns (ran, recorded, lost).
async fn account(
    env: &Env,
    pods: &SimulatedPods,
    from: Timestamp,
    to: Timestamp,
) -> Result<(usize, Vec<String>, Vec<String>)> {
    let ran: BTreeSet<(String, Timestamp)> = pods
        .watch
        .jobs()
        .into_iter()
        .filter(|j| j.ran)
        .filter_map(|j| Some((j.sj?, j.period?)))
        .collect();
    let (mut n_ran, mut recorded, mut lost) = (0, Vec::new(), Vec::new());
    for i in 0..BURST {
        let name = format!("u-{i:02}");
        let st = env.get_sj(&name).await?.status.unwrap_or_default();
        let mut history: BTreeMap<Timestamp, (Timestamp, Outcome, String)> = BTreeMap::new();
        for h in &st.history {
            let last = h.last_period.as_ref().map_or(h.period.0, |l| l.0);
            let reason = h.reason.clone().unwrap_or_default();
            history.insert(h.period.0, (last, h.outcome, reason));
        }
        let mut p = next_instant(from)?;
        while p <= to {
            if ran.contains(&(name.clone(), p)) {
                n_ran += 1;
            } else if let Some((_, (_, outcome, reason))) = history
                .range(..=p)
                .next_back()
                .filter(|(_, (last, _, _))| *last >= p)
            {
                recorded.push(format!("{name} {p} {outcome:?} ({reason})"));
            } else {
                lost.push(format!("{name} {p}"));
            }
            p += SignedDuration::from_secs(EVERY);
        }
    }
    Ok((n_ran, recorded, lost))
}

/// The whole course; see the module doc.
#[tokio::test]
async fn upgrade_rollback_and_upgrade_again_mid_burst() -> Result<()> {
    let _one = ONE.lock().await;
    let prev = older("SINGLETON_PREVIOUS_RELEASE", "")?;
    let old_bin = prev.join("singleton-controller");
    let old_version = std::fs::read_to_string(prev.join("RELEASE"))?;
    let old_tag = old_version
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    let old_app = old_tag.trim_start_matches('v').to_string();
    let new_app = env!("CARGO_PKG_VERSION");
    let mut env = Env::new("upgrade").await?;
    let release = RELEASE;

    // The previous release, installed with its chart and CRD; the namespace opted in to the
    // controller's Jobs, as its admin would (the chart's admission policy).
    run_ok(kubectl().args(["label", "namespace", &env.ns, "singleton.dev/jobs=true"]))?;
    remove_crds(&env).await?;
    helm_apply(&env, "install", release, &prev.join("chart"))?;
    crd_at(&env, &old_app).await?;
    let prefix = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    let pods = SimulatedPods::start(env.client.clone(), &env.ns, &prefix).await?;
    // Every replica as the chart's ServiceAccount, under the RBAC of the chart installed now.
    let kubeconfig =
        env.service_account_kubeconfig(&env.ns, &format!("{release}-singleton-controller"))?;
    let sa = [("KUBECONFIG".to_string(), kubeconfig.display().to_string())];
    let old0 = env.start_controller_bin(&old_bin, &sa, &elect()).await?;
    leads(&env, old0).await?;
    let extra = backstop_spec("db", &prefix, "  concurrencyPolicy: Forbid\n");
    for i in 0..BURST {
        env.create_sj(&sj_yaml(&format!("u-{i:02}"), SCHEDULE, &extra))
            .await?;
    }
    // Every SingletonJob exists by then: its periods are counted from here.
    let created = Timestamp::now();
    burst_ran_after(&env, &pods, created).await?;

    // 1. Upgrade, mid-burst; the old leader stopped: old -> new.
    let at = mid_burst(&env, &pods).await?;
    helm_apply(&env, "upgrade", release, &chart_dir())?;
    let new1 = env.start_controller_with_env(&sa, &elect()).await?;
    env.stop_controller(old0, false).await?;
    leads(&env, new1).await?;
    crd_at(&env, new_app).await?;
    burst_ran_after(&env, &pods, at).await?;

    // 2. Rollback, mid-burst; the new leader frozen past its Lease: new -> old.
    let at = mid_burst(&env, &pods).await?;
    // A rollback as docs/operations.md says: `helm upgrade` to the previous chart, which renders
    // again and keeps the newer CRD (its guard sees a newer version installed), so the fields
    // this tree added are not pruned from stored SingletonJobs. (`helm rollback` replays the
    // old revision's manifest as rendered then, the older CRD with it: tried, it pruned them.)
    helm_apply(&env, "upgrade", release, &prev.join("chart"))?;
    crd_at(&env, new_app).await?;
    ensure(
        &env,
        crd_has_field(&env, "startAt").await?,
        "the rollback kept the newer CRD (with startAt)",
    )
    .await?;
    let old2 = env.start_controller_bin(&old_bin, &sa, &elect()).await?;
    env.signal_controller(new1, "STOP").await?;
    leads(&env, old2).await?;
    burst_ran_after(&env, &pods, at).await?;
    // The frozen replica resumes with what it had in flight, finds its Lease lost, and exits.
    env.signal_controller(new1, "CONT").await?;
    env.wait_for(
        "the resumed new replica to exit",
        Duration::from_secs(30),
        || async { Ok(env.controller_exited(new1).then_some(())) },
    )
    .await?;

    // 3. Upgrade again, mid-burst; the old leader killed: old -> new.
    let at = mid_burst(&env, &pods).await?;
    helm_apply(&env, "upgrade", release, &chart_dir())?;
    let new3 = env.start_controller_with_env(&sa, &elect()).await?;
    env.stop_controller(old2, true).await?;
    leads(&env, new3).await?;
    crd_at(&env, new_app).await?;
    // Counted through the instant after the last handover's: once every SingletonJob ran a
    // later one, each of those is decided (Forbid keeps them in order).
    let to = at + SignedDuration::from_secs(EVERY);
    burst_ran_after(&env, &pods, to).await?;

    // Counted from outside.
    let counted = Counted::take(&env, &pods, created, to).await?;
    println!(
        "upgrade {old_tag} -> {new_app} -> rollback -> upgrade: {}",
        counted.summary()
    );
    ensure(&env, counted.clean() && counted.ran > 0, &counted).await?;
    helm_run(&env, &["uninstall", release, "--wait"])?;
    Ok(())
}

/// The backstop schema version in place for `prefix`.
async fn schema_version(prefix: &str) -> Result<i32> {
    let db = pg().await?;
    let row = db
        .query_one(
            &format!("SELECT max(version) FROM {prefix}schema_version"),
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// The forward migration under load; see the module doc.
#[tokio::test]
async fn the_backstop_is_migrated_under_load_while_an_older_controller_claims() -> Result<()> {
    let _one = ONE.lock().await;
    let older_build = older("SINGLETON_OLDER_SCHEMA", "schema-6")?;
    let old_bin = older_build.join("singleton-controller");
    let mut env = Env::new("migrate").await?;
    let prefix = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    let pods = SimulatedPods::start(env.client.clone(), &env.ns, &prefix).await?;
    let old0 = env.start_controller_bin(&old_bin, &[], &elect()).await?;
    leads(&env, old0).await?;
    let extra = backstop_spec("db", &prefix, "  concurrencyPolicy: Forbid\n");
    for i in 0..BURST {
        env.create_sj(&sj_yaml(&format!("u-{i:02}"), SCHEDULE, &extra))
            .await?;
    }
    let created = Timestamp::now();
    burst_ran_after(&env, &pods, created).await?;
    let before = schema_version(&prefix).await?;

    // Mid-burst, this tree's controller, in a namespace of its own, connects to the same
    // tables and migrates them while the older one claims.
    let at = mid_burst(&env, &pods).await?;
    let mut other = Env::new("migrate-new").await?;
    backstop_secret(&other, "db", &database_url()?, true).await?;
    other.start_controller(&[]).await?;
    other.create_sj(&sj_yaml("m", SCHEDULE, &extra)).await?;
    let migrated = env
        .wait_for("the schema migrated", Duration::from_secs(60), || async {
            let v = schema_version(&prefix).await?;
            Ok((v > before).then_some((v, Timestamp::now())))
        })
        .await?;
    // The older controller goes on claiming against the migrated schema: two more bursts.
    burst_ran_after(&env, &pods, at + SignedDuration::from_secs(EVERY)).await?;
    let old_ran: usize = pods
        .watch
        .jobs()
        .iter()
        .filter(|j| {
            j.ran
                && j.period
                    .is_some_and(|p| p.as_second() >= migrated.1.as_second() + EVERY)
        })
        .count();

    // Then this tree's replica takes over, mid-burst.
    let at = mid_burst(&env, &pods).await?;
    let new1 = env.start_controller(&elect()).await?;
    env.stop_controller(old0, false).await?;
    leads(&env, new1).await?;
    let to = at + SignedDuration::from_secs(EVERY);
    burst_ran_after(&env, &pods, to).await?;

    let counted = Counted::take(&env, &pods, created, to).await?;
    println!(
        "backstop schema {before} -> {} migrated under load at {}; the older controller ran {old_ran} periods after it; {}",
        migrated.0,
        migrated.1,
        counted.summary()
    );
    ensure(
        &env,
        before < migrated.0 && old_ran > 0 && counted.clean(),
        (
            ("schema", before, migrated.0),
            (
                "periods the older controller ran after the migration",
                old_ran,
            ),
            &counted,
        ),
    )
    .await?;
    Ok(())
}
