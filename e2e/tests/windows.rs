//! The windows in which a period could run twice, or never be decided (issue 16), each closed and
//! shown against the real API server and PostgreSQL. The pauses inside the run protocol are in
//! tests/failpoints.rs; these are the ones a state of the world opens: a run holding the fence
//! row under Replace, a Job name taken by another run, a claim that cannot complete, a backfill
//! over periods the claims table never saw, a fence above the claim's token, a wiped status.

use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::{
    Env, Observer, backstop_secret, backstop_spec, database_url, ensure, events_with_reason,
    never_scheduled, pg, plugin, sj_yaml, stderr, stdout, table_prefix,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use singleton::api::Outcome;

async fn status(env: &Env, name: &str) -> Result<singleton::api::SingletonJobStatus> {
    Ok(env.get_sj(name).await?.status.unwrap_or_default())
}

/// Window 3: a Replace whose old run hangs in an open transaction holding the fence row. The
/// claim of the next period cannot advance the fence past it; the old run's Job is deleted, its
/// (simulated) pod dies with its transaction, and the new run starts: the period is not Missed
/// although the wait for the lock outlasts its starting deadline.
#[tokio::test]
async fn replace_stops_a_hung_run_holding_the_fence_and_starts_the_new_one() -> Result<()> {
    let mut env = Env::new("replace-hung").await?;
    let p = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    env.start_controller(&[]).await?;
    let spec = backstop_spec(
        "db",
        &p,
        "  concurrencyPolicy: Replace\n  startingDeadlineSeconds: 4\n",
    );
    env.create_sj(&never_scheduled(sj_yaml("r", "*/12 * * * * *", &spec)))
        .await?;
    let old = env
        .wait_for("a first run", Duration::from_secs(30), || async {
            Ok(status(&env, "r").await?.active.first().cloned())
        })
        .await?;

    // The old run's workload: inside its transaction it passed the fence, then hangs. Its pod
    // dies when its Job is deleted, and its connection with it (the transaction rolls back).
    let key = format!("{}/r", env.ns);
    let jobs = env.jobs();
    let old_name = old.job_name.clone();
    let fence = format!("SELECT {p}fence($1, $2)");
    let (holding, held) = tokio::sync::oneshot::channel();
    let pod = tokio::spawn(async move {
        let mut hung = pg().await?;
        let tx = hung.transaction().await?;
        tx.query_one(&fence, &[&key, &(old.token as i64)]).await?;
        let _ = holding.send(());
        loop {
            match jobs.get_opt(&old_name).await {
                Ok(Some(j)) if j.metadata.deletion_timestamp.is_none() => {}
                _ => break,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        drop(tx);
        drop(hung);
        anyhow::Ok(())
    });
    held.await.context("the hung run's transaction")?;

    let new = env
        .wait_for(
            "the next period's run to replace the hung one",
            Duration::from_secs(60),
            || async {
                Ok(status(&env, "r")
                    .await?
                    .active
                    .into_iter()
                    .find(|r| r.token > old.token))
            },
        )
        .await?;
    pod.await??;
    let st = status(&env, "r").await?;
    ensure(
        &env,
        st.history
            .iter()
            .any(|h| h.outcome == Outcome::Replaced && h.token == Some(old.token))
            && !st.history.iter().any(|h| {
                h.outcome == Outcome::Missed
                    && h.period.0 <= new.period.0
                    && h.period.0 > old.period.0
            }),
        ("old run Replaced, no period Missed in between", &st.history),
    )
    .await?;
    Ok(())
}

/// Window 4: the period's Job name is taken by a Job that is not this SingletonJob's run. The
/// period is decided with an outcome and an Event instead of being retried ahead of every later
/// period for ever, and the later periods run.
#[tokio::test]
async fn a_job_name_taken_by_another_run_decides_the_period_and_later_ones_run() -> Result<()> {
    let mut env = Env::new("name-taken").await?;
    // A period of the schedule some seconds from now, and a stranger's Job under its name.
    let schedule = singleton::schedule::Schedule::parse("*/3 * * * * *", None, Default::default())?;
    let period = schedule
        .next_after(Timestamp::now() + SignedDuration::from_secs(4))
        .context("a next period")?;
    let name = singleton::naming::job_name("n", period);
    let stranger: Job = serde_json::from_value(serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "x", "image": "busybox"}]}}},
    }))?;
    env.jobs().create(&PostParams::default(), &stranger).await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("n", "*/3 * * * * *", "")).await?;

    env.wait_for(
        "the period recorded, and a later one run",
        Duration::from_secs(60),
        || async {
            let st = status(&env, "n").await?;
            let decided = st.history.iter().any(|h| {
                h.period.0 == period
                    && h.outcome == Outcome::Failed
                    && h.reason.as_deref() == Some("JobNameTaken")
            });
            let later = st
                .history
                .iter()
                .any(|h| h.period.0 > period && h.job_name.is_some());
            Ok((decided && later).then_some(()))
        },
    )
    .await?;
    let events = events_with_reason(&env, "JobNameTaken").await?;
    let stranger_left = env.jobs().get_opt(&name).await?;
    ensure(
        &env,
        !events.is_empty()
            && stranger_left.is_some_and(|j| j.annotations().get("singleton.dev/job").is_none()),
        (
            "a JobNameTaken Event, the stranger's Job untouched",
            events.len(),
        ),
    )
    .await?;
    Ok(())
}

/// Window 4, break-lock: a claim whose Job cannot be created (a quota of 0 Jobs) stays pending;
/// break-lock goes before it, clears it (Failed, LockBroken) and fences its token out.
#[tokio::test]
async fn break_lock_clears_a_claim_that_cannot_complete() -> Result<()> {
    let mut env = Env::new("stuck-claim").await?;
    let ns = env.ns.clone();
    let quotas: Api<ResourceQuota> = Api::namespaced(env.client.clone(), &ns);
    let quota: ResourceQuota = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "no-jobs"},
        "spec": {"hard": {"count/jobs.batch": "0"}},
    }))?;
    quotas.create(&PostParams::default(), &quota).await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("q", "*/2 * * * * *", "")).await?;
    let claim = env
        .wait_for(
            "a claim stuck on the quota",
            Duration::from_secs(30),
            || async {
                let st = status(&env, "q").await?;
                Ok(st.pending_claim)
            },
        )
        .await?;

    let out = plugin(
        &["break-lock", "q", "-n", &ns, "--reason", "quota exhausted"],
        &[],
    )?;
    ensure(
        &env,
        out.status.success() && stdout(&out).contains("lock broken"),
        ("break-lock", stdout(&out), stderr(&out)),
    )
    .await?;
    let st = status(&env, "q").await?;
    ensure(
        &env,
        st.fencing_token > claim.token
            && st.history.iter().any(|h| {
                h.token == Some(claim.token)
                    && h.outcome == Outcome::Failed
                    && h.reason.as_deref() == Some("LockBroken")
            })
            && st
                .pending_claim
                .as_ref()
                .is_none_or(|p| p.token > claim.token),
        ("the stuck claim cleared and recorded", &st),
    )
    .await?;

    // With the quota gone, runs start again.
    quotas.delete("no-jobs", &DeleteParams::default()).await?;
    env.wait_for("a run after the quota", Duration::from_secs(60), || async {
        Ok((!env.job_list().await?.is_empty()).then_some(()))
    })
    .await?;
    Ok(())
}

/// Window 5: periods that ran before the backstop was configured have no claim row. A backfill
/// over them is refused (status.claimsRecorded says since when every run has one), and a period
/// with a record of its run elsewhere (a Job, the history) is never started again.
#[tokio::test]
async fn backfill_never_reruns_a_period_the_claims_table_did_not_see() -> Result<()> {
    let mut env = Env::new("backfill-gap").await?;
    let ns = env.ns.clone();
    let p = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    let watch = Observer::watch(env.client.clone(), &ns).await?;
    env.start_controller(&[]).await?;
    // Runs without a backstop first.
    env.create_sj(&sj_yaml("b", "*/2 * * * * *", "")).await?;
    let ran = env
        .wait_for(
            "two runs without a backstop",
            Duration::from_secs(30),
            || async {
                let st = status(&env, "b").await?;
                let periods: Vec<Timestamp> = st
                    .history
                    .iter()
                    .filter(|h| h.job_name.is_some())
                    .map(|h| h.period.0)
                    .collect();
                Ok((periods.len() >= 2).then_some(periods))
            },
        )
        .await?;
    // Then the backstop is added.
    let patch = serde_json::json!({"spec": {"backstop": {"postgres": {
        "secretRef": {"name": "db"}, "tablePrefix": p}}}});
    env.sjs()
        .patch("b", &Default::default(), &kube::api::Patch::Merge(&patch))
        .await?;
    let since = env
        .wait_for(
            "claims recorded from now on",
            Duration::from_secs(30),
            || async { Ok(status(&env, "b").await?.claims_recorded.map(|c| c.since.0)) },
        )
        .await?;
    let oldest = ran.iter().min().copied().context("a run")?;
    let from = (oldest - SignedDuration::from_secs(1)).to_string();
    let to = since.to_string();
    let out = plugin(
        &[
            "backfill",
            "b",
            "-n",
            &ns,
            "--from",
            &from,
            "--to",
            &to,
            "--wait",
            "--timeout",
            "30s",
        ],
        &[],
    )?;
    let text = format!("{}{}", stdout(&out), stderr(&out));
    ensure(
        &env,
        !out.status.success() && text.contains("claimsRecorded"),
        ("backfill over periods run without a claim", &text),
    )
    .await?;
    // However the backfill went, no period has a second Job that ran.
    let seconds = watch.second_runs();
    ensure(
        &env,
        seconds.is_empty() && watch.relists() == 0,
        ("no period that ran was started again", &seconds),
    )
    .await?;
    Ok(())
}

/// Window 6: the backstop's fence rose above the claim's token between the token's choice and
/// the backstop claim (a stray run of an earlier SingletonJob of the same name, a break-lock from
/// elsewhere). The claim is made again with a token above the fence; the run never starts at or
/// below it.
#[tokio::test]
async fn a_fence_above_the_token_is_claimed_again_above_it() -> Result<()> {
    for purpose in ["Correctness", "Efficiency"] {
        let mut env = Env::new(&format!("stale-{}", purpose.to_lowercase())).await?;
        let p = table_prefix(&env);
        backstop_secret(&env, "db", &database_url()?, true).await?;
        // The controller freezes right after its claim write (step 3), before the backstop claim.
        let armed = [(
            "SINGLETON_FAILPOINTS".to_string(),
            format!("{}=stop", singleton::failpoint::CLAIM_WRITTEN),
        )];
        env.start_controller_with_env(&armed, &[]).await?;
        let extra = format!("  lock: {{purpose: {purpose}}}\n");
        env.create_sj(&sj_yaml(
            "s",
            "*/3 * * * * *",
            &backstop_spec("db", &p, &extra),
        ))
        .await?;
        env.wait_for("the claim written", Duration::from_secs(30), || async {
            Ok(env.controller_stopped(0).then_some(()))
        })
        .await?;
        let claimed = status(&env, "s").await?.fencing_token;
        // Meanwhile the fence rises far above it: token 50 issued elsewhere (written to the
        // table, as a controller does; fence() accepts only tokens already issued).
        let key = format!("{}/s", env.ns);
        let db = pg().await?;
        db.execute(
            &format!(
                "INSERT INTO {p}fences AS f (job, token) VALUES ($1, 50) \
                 ON CONFLICT (job) DO UPDATE SET token = greatest(f.token, 50)"
            ),
            &[&key],
        )
        .await?;
        env.signal_controller(0, "CONT").await?;

        let job = env
            .wait_for("a run", Duration::from_secs(30), || async {
                Ok(env.job_list().await?.into_iter().next())
            })
            .await?;
        let token: u64 = job
            .annotations()
            .get("singleton.dev/fencing-token")
            .and_then(|t| t.parse().ok())
            .unwrap_or_default();
        ensure(
            &env,
            claimed < 50 && token > 50,
            (
                purpose,
                "the run's token must be above the fence",
                claimed,
                token,
            ),
        )
        .await?;
    }
    Ok(())
}

/// Window 7: a status wiped by hand (or restored from an older etcd copy) must not make the
/// controller run again the periods its Jobs ran, nor reuse their tokens: their labels are lower
/// bounds for the token and the cursor. Without a backstop, the Jobs kept (history limit 1) are
/// the only record.
#[tokio::test]
async fn a_wiped_status_never_runs_a_period_again_nor_reuses_a_token() -> Result<()> {
    let mut env = Env::new("wiped").await?;
    let watch = Observer::watch(env.client.clone(), &env.ns).await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml(
        "w",
        "*/3 * * * * *",
        "  successfulJobsHistoryLimit: 1\n",
    ))
    .await?;
    let before = env
        .wait_for(
            "two runs, the latest finished",
            Duration::from_secs(40),
            || async {
                let st = status(&env, "w").await?;
                let done = st
                    .history
                    .iter()
                    .filter(|h| h.outcome == Outcome::Succeeded)
                    .count();
                Ok(
                    (done >= 2 && st.active.is_empty() && st.pending_claim.is_none())
                        .then_some(st.fencing_token),
                )
            },
        )
        .await?;

    // `kubectl edit --subresource=status`, emptied.
    let mut sj = env.get_sj("w").await?;
    sj.status = Some(Default::default());
    env.sjs()
        .replace_status("w", &PostParams::default(), &sj)
        .await?;

    // StatusConsistent turns False (StatusBehind) and, once a run claimed after the raise is
    // recorded, True again: the Event stays.
    env.wait_for(
        "a StatusBehind Event, and runs after the wipe",
        Duration::from_secs(40),
        || async {
            let flagged = !events_with_reason(&env, "StatusBehind").await?.is_empty();
            let after = watch
                .jobs()
                .into_iter()
                .filter(|j| j.token.is_some_and(|t| t > before))
                .count();
            Ok((flagged && after >= 2).then_some(()))
        },
    )
    .await?;
    let events = events_with_reason(&env, "StatusBehind").await?;
    let seconds = watch.second_runs();
    let reused: Vec<_> = watch
        .jobs()
        .into_iter()
        .filter(|j| {
            j.token.is_some_and(|t| t <= before)
                && watch
                    .jobs()
                    .iter()
                    .any(|o| o.uid != j.uid && o.token == j.token)
        })
        .collect();
    ensure(
        &env,
        seconds.is_empty() && reused.is_empty() && !events.is_empty(),
        (
            "no period twice, no token reused",
            &seconds,
            &reused,
            events.len(),
        ),
    )
    .await?;
    Ok(())
}
