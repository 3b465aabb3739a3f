//! Size and count limits (issue 19) against the real API server: an oversize `jobTemplate` is
//! refused and starts nothing, `catchUp: All` starts at most `catchUpLimit` late periods, `Allow`
//! keeps at most `maxActive` runs active (scheduled and triggered alike). A backfill over a
//! century is in `bad_input.rs`.

use std::time::Duration;

use anyhow::Result;
use e2e::{Env, ensure, events_with_reason, never_scheduled, sj_yaml};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use singleton::api::{HistoryEntry, OperationPhase, Outcome, SingletonJob};

fn period_of(job: &Job) -> Option<Timestamp> {
    job.annotations()
        .get("singleton.dev/period")
        .and_then(|p| p.parse().ok())
}

/// The periods a history records with this outcome and reason (folded entries count each).
fn counted(history: &[HistoryEntry], outcome: Outcome, reason: &str) -> u64 {
    history
        .iter()
        .filter(|h| h.outcome == outcome && h.reason.as_deref() == Some(reason))
        .map(|h| h.count)
        .sum()
}

/// Creates a SingletonJob from YAML untyped: the Rust type holds no oversize template.
async fn create_raw(env: &Env, yaml: &str) -> Result<()> {
    let ar = ApiResource::erase::<SingletonJob>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &ar);
    let obj: DynamicObject = serde_yaml::from_str(yaml)?;
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

/// A SingletonJob whose template carries `bytes` of annotation text.
fn oversize(name: &str, bytes: usize) -> String {
    sj_yaml(name, "*/2 * * * * *", "").replace(
        "  jobTemplate:\n    spec:\n",
        &format!(
            "  jobTemplate:\n    metadata:\n      annotations: {{big: \"{}\"}}\n    spec:\n",
            "x".repeat(bytes)
        ),
    )
}

#[tokio::test]
async fn an_oversize_job_template_is_refused_and_starts_nothing() -> Result<()> {
    let mut env = Env::new("limits-size").await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("small", "*/2 * * * * *", ""))
        .await?;
    env.wait_for(
        "the small one's first Job",
        Duration::from_secs(30),
        || async { Ok((!env.job_list().await?.is_empty()).then_some(())) },
    )
    .await?;
    // Templates of 1 MiB each (that they are not cached is `api`'s unit test: the process's
    // resident memory says little here, as malloc keeps freed memory until a burst ends).
    const BIG: usize = 8;
    for i in 0..BIG {
        create_raw(&env, &oversize(&format!("big-{i}"), 1024 * 1024)).await?;
    }
    let names: Vec<String> = (0..BIG).map(|i| format!("big-{i}")).collect();
    env.wait_for(
        "JobTemplateValid=False on every oversize one",
        Duration::from_secs(60),
        || async {
            for name in &names {
                let sj = env.get_sj(name).await?;
                let refused = sj.status.as_ref().is_some_and(|s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == "JobTemplateValid"
                            && c.status == "False"
                            && c.message.contains("more than the limit of 65536 bytes")
                    })
                });
                if !refused {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    // Several periods pass: no Job for any of them, and the small one keeps running.
    let token = |sj: singleton::api::SingletonJob| sj.status.map_or(0, |s| s.fencing_token);
    let small_before = token(env.get_sj("small").await?);
    env.wait_for(
        "several periods of the small one",
        Duration::from_secs(30),
        || async { Ok((token(env.get_sj("small").await?) >= small_before + 3).then_some(())) },
    )
    .await?;
    let jobs = env.job_list().await?;
    let big_jobs: Vec<String> = jobs
        .iter()
        .filter(|j| j.name_any().starts_with("big-"))
        .map(|j| j.name_any())
        .collect();
    ensure(
        &env,
        big_jobs.is_empty(),
        ("Jobs of oversize templates", &big_jobs),
    )
    .await?;
    let small_after = token(env.get_sj("small").await?);
    ensure(
        &env,
        small_after > small_before,
        (
            "the small one kept running (its token)",
            small_before,
            small_after,
        ),
    )
    .await?;
    let events = events_with_reason(&env, "JobTemplateRejected").await?;
    ensure(
        &env,
        events.len() >= BIG,
        ("JobTemplateRejected Events", events.len()),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn catch_up_all_after_a_suspension_starts_at_most_catch_up_limit() -> Result<()> {
    let mut env = Env::new("limits-catchup").await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml(
        "c",
        "* * * * * *",
        "  suspend: true\n  catchUp: All\n  catchUpLimit: 3\n  concurrencyPolicy: Allow\n  maxActive: 100\n",
    ))
    .await?;
    // The fault (a fixed sleep on purpose): suspended across a dozen every-second periods.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let resumed = Timestamp::now();
    let patch = serde_json::json!({"spec": {"suspend": false}});
    env.sjs()
        .patch("c", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    env.wait_for("runs after the resume", Duration::from_secs(30), || async {
        let jobs = env.job_list().await?;
        Ok(jobs
            .iter()
            .filter_map(period_of)
            .any(|p| p > resumed + SignedDuration::from_secs(2))
            .then_some(()))
    })
    .await?;
    let jobs = env.job_list().await?;
    let mut late: Vec<Timestamp> = jobs
        .iter()
        .filter_map(period_of)
        .filter(|p| *p <= resumed)
        .collect();
    late.sort();
    let sj = env.get_sj("c").await?;
    let history = sj.status.unwrap_or_default().history;
    let capped = counted(&history, Outcome::Missed, "CatchUpLimit");
    println!("late periods started: {late:?}; {capped} recorded as CatchUpLimit");
    ensure(
        &env,
        late.len() <= 3,
        ("more late periods started than catchUpLimit 3", &late),
    )
    .await?;
    // Every other period of the suspension is recorded, none silently lost.
    ensure(
        &env,
        capped >= 8,
        ("periods recorded Missed/CatchUpLimit", capped, &history),
    )
    .await?;
    let events = events_with_reason(&env, "RunMissed").await?;
    ensure(
        &env,
        events.iter().any(|e| {
            e.message
                .as_deref()
                .unwrap_or_default()
                .contains("CatchUpLimit")
        }),
        ("a RunMissed Event saying CatchUpLimit", events.len()),
    )
    .await?;
    let metrics = env.metrics(0).await?;
    ensure(
        &env,
        metrics.lines().any(|l| {
            l.starts_with("singleton_periods_missed_total{")
                && l.contains("reason=\"CatchUpLimit\"")
                && l.contains(&format!("namespace=\"{}\"", env.ns))
        }),
        "singleton_periods_missed_total{reason=\"CatchUpLimit\"}",
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn allow_keeps_at_most_max_active_runs_and_trigger_spam_waits() -> Result<()> {
    let mut env = Env::new("limits-active").await?;
    env.start_controller(&[]).await?;
    // Its Jobs never get a node: every run stays active.
    env.create_sj(&never_scheduled(sj_yaml(
        "a",
        "* * * * * *",
        "  concurrencyPolicy: Allow\n  maxActive: 2\n  catchUp: None\n",
    )))
    .await?;
    env.wait_for("two active runs", Duration::from_secs(30), || async {
        Ok((env.job_list().await?.len() >= 2).then_some(()))
    })
    .await?;
    // Trigger spam: ten requests in a row, each a new id.
    for i in 0..10 {
        let req = serde_json::json!({"id": format!("spam-{i}")}).to_string();
        let patch =
            serde_json::json!({"metadata": {"annotations": {"singleton.dev/trigger": req}}});
        env.sjs()
            .patch("a", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    // Periods keep falling due; none may start while two are active.
    let sj = env
        .wait_for(
            "periods recorded Skipped/MaxActive and the trigger waiting",
            Duration::from_secs(30),
            || async {
                let sj = env.get_sj("a").await?;
                let status = sj.status.clone().unwrap_or_default();
                let waiting = status.operations.trigger.as_ref().is_some_and(|t| {
                    t.phase == OperationPhase::Pending && t.message.contains("maxActive is 2")
                });
                let skipped = counted(&status.history, Outcome::Skipped, "MaxActive");
                Ok((waiting && skipped >= 5).then_some(sj))
            },
        )
        .await?;
    let jobs = env.job_list().await?;
    let status = sj.status.unwrap_or_default();
    ensure(
        &env,
        jobs.len() == 2 && status.active_count == 2,
        (
            "Jobs and active runs beyond maxActive 2",
            jobs.iter().map(|j| j.name_any()).collect::<Vec<_>>(),
            status.active_count,
        ),
    )
    .await?;
    let metrics = env.metrics(0).await?;
    ensure(
        &env,
        metrics.lines().any(|l| {
            l.starts_with("singleton_periods_skipped_total{")
                && l.contains("reason=\"MaxActive\"")
                && l.contains(&format!("namespace=\"{}\"", env.ns))
        }),
        "singleton_periods_skipped_total{reason=\"MaxActive\"}",
    )
    .await?;
    // Room again: one active Job deleted, exactly one new run takes its place (the trigger or a
    // period), never more.
    let first = jobs[0].name_any();
    env.jobs()
        .delete(&first, &kube::api::DeleteParams::background())
        .await?;
    env.wait_job_gone("an active run", &first).await?;
    env.wait_for(
        "a new run in the freed slot",
        Duration::from_secs(30),
        || async {
            let names: Vec<String> = env.job_list().await?.iter().map(|j| j.name_any()).collect();
            Ok((names.len() == 2 && !names.contains(&first)).then_some(()))
        },
    )
    .await?;
    // Never more: a negative check, so it waits for the controller to have decided three more
    // periods (Skipped, MaxActive) after the new run, then counts the Jobs.
    let skipped = counted(
        &env.get_sj("a").await?.status.unwrap_or_default().history,
        Outcome::Skipped,
        "MaxActive",
    );
    env.wait_for(
        "three more periods decided after the new run",
        Duration::from_secs(30),
        || async {
            let status = env.get_sj("a").await?.status.unwrap_or_default();
            Ok(
                (counted(&status.history, Outcome::Skipped, "MaxActive") >= skipped + 3)
                    .then_some(()),
            )
        },
    )
    .await?;
    let n = env.job_list().await?.len();
    ensure(&env, n == 2, ("Jobs after the freed slot", n)).await?;
    Ok(())
}

/// The ResourceQuota docs/install.md recommends counts SingletonJobs: the API server refuses one
/// more than the quota allows.
#[tokio::test]
async fn a_resource_quota_bounds_the_number_of_singletonjobs() -> Result<()> {
    let env = Env::new("limits-quota").await?;
    let quota: k8s_openapi::api::core::v1::ResourceQuota =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "singletonjobs"},
            "spec": {"hard": {"count/singletonjobs.singleton.dev": "1"}},
        }))?;
    Api::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &quota)
        .await?;
    // The quota controller fills in its usage first; until then creates are refused too.
    env.wait_for("the quota's usage", Duration::from_secs(30), || async {
        let q: k8s_openapi::api::core::v1::ResourceQuota =
            Api::namespaced(env.client.clone(), &env.ns)
                .get("singletonjobs")
                .await?;
        Ok(q.status.and_then(|s| s.used).map(|_| ()))
    })
    .await?;
    env.create_sj(&sj_yaml("one", "0 3 * * *", "")).await?;
    // The quota admission plugin reads quotas from its informer and, for a namespace it found
    // none in, from a lookup it keeps for 30 s: a quota this new may not be enforced yet (seen
    // on a loaded machine, 2026-12-05). A second SingletonJob admitted meanwhile is deleted
    // and tried again; the quota must refuse it within 40 s.
    let admitted = std::cell::Cell::new(0);
    let refused = env
        .wait_for(
            "a second SingletonJob refused by the quota of 1",
            Duration::from_secs(40),
            || async {
                match env.create_sj(&sj_yaml("two", "0 3 * * *", "")).await {
                    Err(e) => Ok(Some(format!("{e:#}"))),
                    Ok(_) => {
                        admitted.set(admitted.get() + 1);
                        env.sjs().delete("two", &Default::default()).await?;
                        env.wait_for("the admitted one gone", Duration::from_secs(10), || async {
                            Ok(env.sjs().get_opt("two").await?.is_none().then_some(()))
                        })
                        .await?;
                        Ok(None)
                    }
                }
            },
        )
        .await?;
    ensure(
        &env,
        refused.contains("exceeded quota"),
        (
            "a second SingletonJob under a quota of 1",
            &refused,
            admitted.get(),
        ),
    )
    .await?;
    Ok(())
}
