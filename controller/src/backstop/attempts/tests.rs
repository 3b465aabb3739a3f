//! Attempts, holders and the schema-5 fences against a real PostgreSQL (`$DATABASE_URL`, as the
//! other backstop tests): two processes of one run, as a partitioned pod and its replacement are.

use std::time::{Duration, Instant};

use jiff::Timestamp;

use super::super::tests::{
    backstop, cleanup, cluster, db_message, sqlstate, ts, unique_prefix, workload,
};
use super::super::{
    ATTEMPT_SQLSTATE, Backstop, ClaimOutcome, Claimer, STALE_TOKEN_SQLSTATE, withdrawal,
};
use crate::Error;

const JOB: &str = "billing/invoices";

/// A backstop with `JOB` claimed for one period with token `token`, and a writes table
/// `<p>writes(attempt, at)` the "workload" appends to under the fence.
async fn claimed(tag: &str, token: u64) -> (crate::backstop::TablePrefix, Backstop) {
    let prefix = unique_prefix(tag);
    let b = backstop(&prefix);
    let p = ts("2027-01-01T06:00:00Z");
    assert_eq!(
        b.claim(JOB, p, token, "invoices-1", None).await.unwrap(),
        ClaimOutcome::Claimed
    );
    workload()
        .await
        .batch_execute(&format!(
            "CREATE TABLE {}writes (attempt text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
            prefix.as_str()
        ))
        .await
        .unwrap();
    (prefix, b)
}

/// Waits until the session `pid` waits on a lock (a fence row held by another transaction).
async fn waits_on_a_lock(pid: i32) {
    let admin = workload().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: Option<String> = admin
            .query_one(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0);
        if waiting.as_deref() == Some("Lock") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "session {pid} never waited on the fence row"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn pid(c: &tokio_postgres::Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// One fenced transaction of `attempt`: the three-argument fence first, then a write; whether it
/// committed.
async fn fenced_write(
    c: &mut tokio_postgres::Client,
    p: &str,
    token: i64,
    attempt: &str,
) -> Result<(), tokio_postgres::Error> {
    let tx = c.transaction().await?;
    tx.query_one(
        &format!("SELECT {p}fence($1, $2, $3)"),
        &[&JOB, &token, &attempt],
    )
    .await?;
    tx.execute(
        &format!("INSERT INTO {p}writes (attempt) VALUES ($1)"),
        &[&attempt],
    )
    .await?;
    tx.commit().await
}

/// F1, at the database: two attempts (pods) of one run with the same token, as a partitioned pod
/// and its replacement. The older one's open transaction commits before the newer one's
/// registration returns (it waits for the row lock); from then on every fenced transaction of the
/// older one is refused (SF004), however it calls, and the newer one's commit. No write of the
/// older attempt committed after the newer one began.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_newer_attempt_fences_out_the_older_one_of_the_same_run() {
    let (prefix, b) = claimed("attempts", 1).await;
    let p = prefix.as_str();
    let register = format!("SELECT {p}attempt($1, $2, $3)");

    let mut old = workload().await;
    let seq: i32 = old
        .query_one(&register, &[&JOB, &1i64, &"pod-a"])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seq, 1);
    let again: i32 = old
        .query_one(&register, &[&JOB, &1i64, &"pod-a"])
        .await
        .unwrap()
        .get(0);
    assert_eq!(again, 1, "registering again as the newest changes nothing");
    fenced_write(&mut old, p, 1, "pod-a").await.unwrap();

    // The old pod is in a transaction (fenced, written, not committed) when its replacement
    // starts and registers.
    let tx = old.transaction().await.unwrap();
    tx.query_one(
        &format!("SELECT {p}fence($1, $2, $3)"),
        &[&JOB, &1i64, &"pod-a"],
    )
    .await
    .unwrap();
    tx.execute(
        &format!("INSERT INTO {p}writes (attempt) VALUES ('pod-a')"),
        &[],
    )
    .await
    .unwrap();
    let new = workload().await;
    let new_pid = pid(&new).await;
    let register2 = register.clone();
    let registering = tokio::spawn(async move {
        let seq: i32 = new
            .query_one(&register2, &[&JOB, &1i64, &"pod-b"])
            .await
            .unwrap()
            .get(0);
        (new, seq)
    });
    waits_on_a_lock(new_pid).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !registering.is_finished(),
        "registered past an open transaction of the older attempt"
    );
    tx.commit().await.unwrap();
    let (mut new, seq) = registering.await.unwrap();
    assert_eq!(seq, 2);

    // The older attempt is fenced out, with either fence and on registering again.
    let e = fenced_write(&mut old, p, 1, "pod-a").await.unwrap_err();
    assert_eq!(sqlstate(&e), Some(ATTEMPT_SQLSTATE), "{e}");
    assert_eq!(
        db_message(&e),
        format!(
            "attempt pod-a of job {JOB} (fencing token 1) was superseded by attempt #2 (pod-b)"
        )
    );
    let e = old
        .query_one(&format!("SELECT {p}fence($1, $2)"), &[&JOB, &1i64])
        .await
        .unwrap_err();
    assert_eq!(
        sqlstate(&e),
        Some(ATTEMPT_SQLSTATE),
        "the token-only fence too: {e}"
    );
    let e = old
        .query_one(&register, &[&JOB, &1i64, &"pod-a"])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), Some(ATTEMPT_SQLSTATE), "no coming back: {e}");

    fenced_write(&mut new, p, 1, "pod-b").await.unwrap();
    let attempts = b.attempts(JOB, 1).await.unwrap();
    let ids: Vec<(i32, &str)> = attempts
        .iter()
        .map(|a| (a.seq, a.attempt.as_str()))
        .collect();
    assert_eq!(ids, [(1, "pod-a"), (2, "pod-b")]);
    // From outside, as the chaos checker counts: no write of the older attempt after the newer
    // one registered.
    let late: i64 = workload()
        .await
        .query_one(
            &format!("SELECT count(*) FROM {p}writes WHERE attempt = 'pod-a' AND at >= $1"),
            &[&attempts[1].registered_at],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(late, 0);
    let written: Vec<String> = workload()
        .await
        .query(&format!("SELECT attempt FROM {p}writes ORDER BY at"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(written, ["pod-a", "pod-a", "pod-b"]);
    assert_eq!(b.rejections().await.unwrap(), 3);
    cleanup(&prefix).await;
}

/// The same race with both attempts writing in a loop, as the review's test describes (a fenced
/// write every few milliseconds from each of two processes of one run): once the second has
/// registered, the first commits nothing more, and their committed writes never interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_attempts_writing_in_a_loop_never_interleave_their_commits() {
    let (prefix, b) = claimed("loop", 1).await;
    let p = prefix.as_str().to_string();
    let writer = |attempt: &'static str, register_after: Duration| {
        let p = p.clone();
        tokio::spawn(async move {
            let mut c = workload().await;
            tokio::time::sleep(register_after).await;
            c.query_one(
                &format!("SELECT {p}attempt($1, $2, $3)"),
                &[&JOB, &1i64, &attempt],
            )
            .await
            .unwrap();
            let until = Instant::now() + Duration::from_millis(1500);
            let mut committed = 0;
            while Instant::now() < until {
                match fenced_write(&mut c, &p, 1, attempt).await {
                    Ok(()) => committed += 1,
                    Err(e) => {
                        assert_eq!(sqlstate(&e), Some(ATTEMPT_SQLSTATE), "{e}");
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            committed
        })
    };
    let a = writer("pod-a", Duration::ZERO);
    let bb = writer("pod-b", Duration::from_millis(400));
    let (a, bb) = (a.await.unwrap(), bb.await.unwrap());
    assert!(
        a > 0 && bb > 0,
        "both committed some writes before and after: {a} {bb}"
    );
    let attempts = b.attempts(JOB, 1).await.unwrap();
    assert_eq!(attempts.len(), 2);
    let rows = workload()
        .await
        .query(
            &format!("SELECT attempt, at FROM {p}writes ORDER BY at"),
            &[],
        )
        .await
        .unwrap();
    let last_a: Timestamp = rows
        .iter()
        .filter(|r| r.get::<_, String>(0) == "pod-a")
        .map(|r| r.get(1))
        .max()
        .unwrap();
    let first_b: Timestamp = rows
        .iter()
        .filter(|r| r.get::<_, String>(0) == "pod-b")
        .map(|r| r.get(1))
        .min()
        .unwrap();
    assert!(
        last_a < attempts[1].registered_at,
        "pod-a committed after pod-b began"
    );
    assert!(last_a < first_b);
    cleanup(&prefix).await;
}

/// The token-only fence keeps its meaning for workloads that never register: stale and retired
/// tokens are refused, but two processes of one run both pass (the limitation the attempts
/// close). An attempt that never registered is told to.
#[tokio::test]
async fn the_token_only_fence_cannot_tell_two_pods_of_a_run_apart() {
    let (prefix, b) = claimed("tokenonly", 1).await;
    let p = prefix.as_str();
    let fence2 = format!("SELECT {p}fence($1, $2)");
    for _ in 0..2 {
        let c = workload().await;
        let t: i64 = c.query_one(&fence2, &[&JOB, &1i64]).await.unwrap().get(0);
        assert_eq!(t, 1, "each of two processes of the run passes");
    }
    let mut c = workload().await;
    let e = fenced_write(&mut c, p, 1, "pod-x").await.unwrap_err();
    assert_eq!(sqlstate(&e), Some(ATTEMPT_SQLSTATE));
    assert!(db_message(&e).contains("is not registered"), "{e}");
    b.retire(JOB, 1, "").await.unwrap();
    let e = c.query_one(&fence2, &[&JOB, &1i64]).await.unwrap_err();
    assert_eq!(sqlstate(&e), Some(STALE_TOKEN_SQLSTATE));
    let e = c
        .query_one(
            &format!("SELECT {p}attempt($1, $2, $3)"),
            &[&JOB, &1i64, &"pod-y"],
        )
        .await
        .unwrap_err();
    assert_eq!(
        sqlstate(&e),
        Some(STALE_TOKEN_SQLSTATE),
        "no attempt begins on a retired token"
    );
    cleanup(&prefix).await;
}

/// Attempts belong to their run: a new claim (a new token) starts their count again, and an
/// attempt of the older token is stale, registered or not.
#[tokio::test]
async fn a_new_run_starts_its_own_attempts() {
    let (prefix, b) = claimed("newrun", 1).await;
    let p = prefix.as_str();
    let register = format!("SELECT {p}attempt($1, $2, $3)");
    let c = workload().await;
    c.query_one(&register, &[&JOB, &1i64, &"pod-a"])
        .await
        .unwrap();
    b.claim(JOB, ts("2027-01-01T07:00:00Z"), 2, "invoices-2", None)
        .await
        .unwrap();
    let seq: i32 = c
        .query_one(&register, &[&JOB, &2i64, &"pod-c"])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seq, 1);
    let e = c
        .query_one(&register, &[&JOB, &1i64, &"pod-a"])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), Some(STALE_TOKEN_SQLSTATE));
    cleanup(&prefix).await;
}

/// F4: a replica that paused past its Lease decides, stale, that a claim's period ran without a
/// Job (its create refused past the deadline) while another replica completed the claim and its
/// Job's pod registered. The retirement of that token is refused inside the database, so the
/// live run is not fenced out; before any attempt registered it goes through (and the late
/// registration is then refused).
#[tokio::test]
async fn a_stale_decision_without_a_job_cannot_retire_a_run_that_started() {
    let (prefix, b) = claimed("unstarted", 1).await;
    let p = prefix.as_str();
    let c = workload().await;
    c.query_one(
        &format!("SELECT {p}attempt($1, $2, $3)"),
        &[&JOB, &1i64, &"pod-a"],
    )
    .await
    .unwrap();
    let e = b.retire_unstarted(JOB, 1, "").await.unwrap_err();
    assert!(
        matches!(&e, Error::RunStarted { token: 1, attempt, .. } if attempt == "pod-a"),
        "{e}"
    );
    assert_eq!(b.retired(JOB).await.unwrap(), 0, "not retired");
    let mut w = workload().await;
    fenced_write(&mut w, p, 1, "pod-a").await.unwrap();

    // A second run, decided without a Job before any pod of it registered: retired.
    b.claim(JOB, ts("2027-01-01T07:00:00Z"), 2, "invoices-2", None)
        .await
        .unwrap();
    b.retire_unstarted(JOB, 2, "").await.unwrap();
    assert_eq!(b.retired(JOB).await.unwrap(), 2);
    let e = c
        .query_one(
            &format!("SELECT {p}attempt($1, $2, $3)"),
            &[&JOB, &2i64, &"pod-b"],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), Some(STALE_TOKEN_SQLSTATE));
    cleanup(&prefix).await;
}

/// F6: a workload on a node that died mid-transaction keeps its session, and the fence row's
/// lock, for hours. Break-lock finds the sessions holding the job's fence and ends them: the open
/// transaction rolls back (nothing of it commits) and the fence row is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn break_lock_ends_a_session_that_holds_the_fence() {
    let (prefix, b) = claimed("holders", 1).await;
    let p = prefix.as_str();
    let mut hung = workload().await;
    hung.query_one(
        &format!("SELECT {p}attempt($1, $2, $3)"),
        &[&JOB, &1i64, &"pod-a"],
    )
    .await
    .unwrap();
    let hung_pid = pid(&hung).await;
    let tx = hung.transaction().await.unwrap();
    tx.query_one(
        &format!("SELECT {p}fence($1, $2, $3)"),
        &[&JOB, &1i64, &"pod-a"],
    )
    .await
    .unwrap();
    tx.execute(
        &format!("INSERT INTO {p}writes (attempt) VALUES ('pod-a')"),
        &[],
    )
    .await
    .unwrap();
    let holders = b.fence_holders(JOB).await.unwrap();
    assert_eq!(
        holders.iter().map(|h| h.pid).collect::<Vec<_>>(),
        [hung_pid]
    );
    assert!(holders[0].since.is_some());
    assert!(
        b.fence_holders("other/job").await.unwrap().is_empty(),
        "per job"
    );
    let ended = b.end_fence_holders(JOB).await.unwrap();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].result, Ok(()), "{ended:?}");
    assert!(tx.commit().await.is_err(), "its session is gone");
    let started = Instant::now();
    b.retire(JOB, 1, "").await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the fence row is free"
    );
    let n: i64 = workload()
        .await
        .query_one(&format!("SELECT count(*) FROM {p}writes"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "nothing of the ended transaction committed");
    assert!(b.fence_holders(JOB).await.unwrap().is_empty());
    cleanup(&prefix).await;
}

/// F7: across clusters a scheduled period is due by the database's clock, the one they share. A
/// cluster whose controller and API server run ahead together claims nothing before the
/// period's instant by that clock (NotYet until then); a run a user asked for, and a controller
/// without a cluster identity, are not held.
#[tokio::test]
async fn across_clusters_a_period_is_due_by_the_databases_clock() {
    let prefix = unique_prefix("dbclock");
    let b = backstop(&prefix);
    let admin = workload().await;
    let db_now: Timestamp = admin.query_one("SELECT now()", &[]).await.unwrap().get(0);
    let ahead = Timestamp::from_second(db_now.as_second() + 30).unwrap();
    let west = cluster("west", Some(60), None);
    let got = b
        .claim_as(JOB, ahead, 1, "invoices-a", None, &west)
        .await
        .unwrap();
    assert_eq!(got, ClaimOutcome::NotYet { until: ahead });
    assert_eq!(b.fence(JOB).await.unwrap(), 0, "nothing claimed");
    let manual = Claimer {
        scheduled: false,
        ..west.clone()
    };
    let got = b
        .claim_as(JOB, ahead, 1, "invoices-a", None, &manual)
        .await
        .unwrap();
    assert_eq!(
        got,
        ClaimOutcome::Claimed,
        "a trigger is due when asked for"
    );
    let later = Timestamp::from_second(ahead.as_second() + 60).unwrap();
    let got = b
        .claim_as(JOB, later, 2, "invoices-b", None, &Claimer::default())
        .await
        .unwrap();
    assert_eq!(
        got,
        ClaimOutcome::Claimed,
        "one cluster: its own clock checks are the controller's"
    );
    cleanup(&prefix).await;
}

/// F14: a run a user asked for in one cluster (a trigger: its period is never on a whole second)
/// is outside the schedule's order; another cluster's scheduled claim of an earlier period is not
/// Superseded by it.
#[tokio::test]
async fn a_trigger_in_one_cluster_supersedes_no_period_of_another() {
    let prefix = unique_prefix("trigger");
    let b = backstop(&prefix);
    let (west, east) = (
        cluster("west", Some(60), None),
        cluster("east", Some(60), None),
    );
    let p1 = ts("2025-01-01T06:00:00Z");
    let trigger = ts("2025-01-01T06:00:30.123456Z");
    let manual = Claimer {
        scheduled: false,
        ..west.clone()
    };
    assert_eq!(
        b.claim_as(JOB, trigger, 1, "invoices-t", None, &manual)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        b.claim_as(JOB, p1, 2, "invoices-1", None, &east)
            .await
            .unwrap(),
        ClaimOutcome::Claimed,
        "not Superseded by west's trigger"
    );
    // A scheduled later period of another cluster still supersedes.
    let p2 = ts("2025-01-01T06:01:00Z");
    let p0 = ts("2025-01-01T05:59:00Z");
    b.claim_as(JOB, p2, 3, "invoices-2", None, &west)
        .await
        .unwrap();
    assert!(matches!(
        b.claim_as(JOB, p0, 4, "invoices-0", None, &east)
            .await
            .unwrap(),
        ClaimOutcome::Superseded { .. }
    ));
    cleanup(&prefix).await;
}

/// The archive's rows of `JOB`, by token: (period, token, job name, cluster, claimed at,
/// reason).
type Archived = (Timestamp, i64, String, String, Timestamp, String);

async fn archived(prefix: &crate::backstop::TablePrefix) -> Vec<Archived> {
    workload()
        .await
        .query(
            &format!(
                "SELECT period, token, job_name, cluster, claimed_at, reason FROM {}withdrawn_claims \
                 WHERE job = $1 AND withdrawn_at >= claimed_at ORDER BY token",
                prefix.as_str()
            ),
            &[&JOB],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect()
}

/// A token-only fence call of `token` in a transaction of its own: its refusal's SQLSTATE.
async fn fence_refusal(prefix: &crate::backstop::TablePrefix, token: i64) -> Option<String> {
    let e = workload()
        .await
        .query_one(
            &format!("SELECT {}fence($1, $2)", prefix.as_str()),
            &[&JOB, &token],
        )
        .await
        .err()?;
    sqlstate(&e).map(str::to_string)
}

/// Withdrawal (schema 9; F10c, and a prepared run's withdrawal later): a claim whose run never
/// started leaves `<p>claims` for `<p>withdrawn_claims`, with its Job name, cluster, claim time
/// and the reason, and its token is retired: the fence refuses it, and nothing that asks "has
/// this period run" (`claimed`, `claims_between`) sees it. So the period is claimed again with a
/// higher token, as a period never claimed is (Claimed, not Duplicate), while UNIQUE(job,
/// period) still holds one live row. A second withdrawal of the same token changes nothing; a
/// withdrawal of a token the row no longer names leaves the row alone; the same period withdrawn
/// again with its new token keeps both archive rows. A run whose attempt registered is refused
/// (RunStarted) and moves nothing. Fails without the archive's INSERT: the archive stays empty.
#[tokio::test]
async fn a_withdrawn_claim_is_archived_and_its_period_claimed_again() {
    let prefix = unique_prefix("withdraw");
    let b = backstop(&prefix);
    // In the past: a scheduled claim of a cluster waits for its period (NotYet) otherwise.
    let p = ts("2025-01-01T06:00:00Z");
    let west = cluster("west", None, None);
    assert_eq!(
        b.claim_as(JOB, p, 1, "invoices-1", None, &west)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    let row = b.claimed(JOB, p).await.unwrap().expect("the claim's row");
    assert_eq!(b.claims_between(JOB, p, p).await.unwrap().len(), 1);

    b.withdraw(JOB, p, 1, "", withdrawal::BACKSTOP_OUTAGE)
        .await
        .unwrap();
    assert!(b.claimed(JOB, p).await.unwrap().is_none(), "the row left");
    assert!(
        b.claims_between(JOB, p, p).await.unwrap().is_empty(),
        "repair does not see it"
    );
    let first = (
        p,
        1,
        "invoices-1".to_string(),
        "west".to_string(),
        row.claimed_at,
        "BackstopOutage".to_string(),
    );
    assert_eq!(archived(&prefix).await, vec![first.clone()], "moved");
    assert_eq!(b.retired(JOB).await.unwrap(), 1, "its token retired");
    assert_eq!(
        fence_refusal(&prefix, 1).await.as_deref(),
        Some(STALE_TOKEN_SQLSTATE)
    );

    // Again (a replica that died before the status write): harmless, archived once, as it was.
    b.withdraw(JOB, p, 1, "", "Suspended").await.unwrap();
    assert_eq!(archived(&prefix).await, vec![first.clone()]);

    // The period is claimed again, with a token above the fence: a claim like any other.
    assert_eq!(
        b.claim_as(JOB, p, 2, "invoices-1-again", None, &west)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(b.claimed(JOB, p).await.unwrap().map(|r| r.token), Some(2));
    assert_eq!(fence_refusal(&prefix, 2).await, None, "the new run fences");
    assert_eq!(
        fence_refusal(&prefix, 1).await.as_deref(),
        Some(STALE_TOKEN_SQLSTATE)
    );
    // The withdrawn token's withdrawal again leaves the new claim alone.
    b.withdraw(JOB, p, 1, "", withdrawal::BACKSTOP_OUTAGE)
        .await
        .unwrap();
    let again = b.claimed(JOB, p).await.unwrap().expect("the new claim");
    assert_eq!(again.token, 2);
    assert_eq!(archived(&prefix).await.len(), 1);

    // Withdrawn a second time, with its new token: two archive rows for the one period.
    b.withdraw(JOB, p, 2, "", "Suspended").await.unwrap();
    assert!(b.claimed(JOB, p).await.unwrap().is_none());
    let second = (
        p,
        2,
        "invoices-1-again".to_string(),
        "west".to_string(),
        again.claimed_at,
        "Suspended".to_string(),
    );
    assert_eq!(archived(&prefix).await, vec![first.clone(), second.clone()]);

    // A run that started is never withdrawn: refused, nothing moved, its token still fences.
    assert_eq!(
        b.claim(JOB, p, 3, "invoices-1-third", None).await.unwrap(),
        ClaimOutcome::Claimed
    );
    let c = workload().await;
    c.query_one(
        &format!("SELECT {}attempt($1, $2, $3)", prefix.as_str()),
        &[&JOB, &3i64, &"pod-a"],
    )
    .await
    .unwrap();
    let e = b
        .withdraw(JOB, p, 3, "", withdrawal::BACKSTOP_OUTAGE)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::RunStarted { .. }), "{e}");
    assert_eq!(b.claimed(JOB, p).await.unwrap().map(|r| r.token), Some(3));
    assert_eq!(archived(&prefix).await, vec![first, second]);
    assert_eq!(b.retired(JOB).await.unwrap(), 2);
    c.query_one(
        &format!("SELECT {}fence($1, $2, $3)", prefix.as_str()),
        &[&JOB, &3i64, &"pod-a"],
    )
    .await
    .expect("the started run still fences");

    // A reason the archive cannot hold is refused before any statement.
    for reason in ["", "Ünicode", &"x".repeat(withdrawal::MAX_REASON + 1)] {
        let e = b.withdraw(JOB, p, 3, "", reason).await.unwrap_err();
        assert!(matches!(e, Error::Backstop(_)), "{e}");
    }
    cleanup(&prefix).await;
}
