//! Job keys belong to a namespace (issue 34, N4): the rule, and the claim transaction, the
//! retirements and the withdrawal against a real PostgreSQL (`$DATABASE_URL`, as the other
//! backstop tests), with two tenants sharing one database role, as docs/multi-cluster.md's
//! set-up has them.

use super::super::tests::{backstop, cleanup, cluster, ts, unique_prefix, workload};
use super::super::{Backstop, ClaimOutcome, Claimer};
use super::*;

const VICTIM: &str = "b/victim";

#[test]
fn a_key_belongs_to_its_first_namespace_unless_shared() {
    // Not recorded yet: the claim goes on and records its namespace.
    assert!(!refuses(None, "b"));
    // Recorded: only its namespace, or anyone when an administrator shared it.
    assert!(!refuses(Some("b"), "b"));
    assert!(refuses(Some("b"), "a"));
    assert!(refuses(Some("b"), "b-prod"));
    assert!(!refuses(Some(SHARED), "a"));
    // An empty claimant is a library caller that names none.
    assert!(!refuses(Some("b"), ""));
    assert_eq!(recorded(""), None);
    assert_eq!(recorded("b"), Some("b"));
    assert!(matches!(check("k", Some("b"), "a"), Err(Error::NotOwner { job }) if job == "k"));
    assert!(check("k", Some("b"), "b").is_ok());
}

/// A claimer of `namespace`, in a single cluster, for a scheduled run.
fn tenant(namespace: &str) -> Claimer {
    Claimer {
        scheduled: true,
        namespace: namespace.into(),
        ..Claimer::default()
    }
}

async fn claim(b: &Backstop, at: &str, token: u64, who: &Claimer) -> ClaimOutcome {
    b.claim_as(VICTIM, ts(at), token, "victim-run", None, who)
        .await
        .unwrap()
}

/// The owner stored for `VICTIM` (None: none recorded, or no row).
async fn stored_owner(prefix: &super::super::TablePrefix) -> Option<String> {
    workload()
        .await
        .query_opt(
            &format!(
                "SELECT namespace FROM {}fences WHERE job = $1",
                prefix.as_str()
            ),
            &[&VICTIM],
        )
        .await
        .unwrap()
        .and_then(|r| r.get(0))
}

/// The N4 attack from the review: namespace a names b's job key. Its claims, of a new period or
/// of one b claimed, are refused without a change and without learning anything of b's claims
/// (not Duplicate with b's Job name); its retirements (a break-lock) and withdrawals (a planted
/// unsettled claim) are refused too; b goes on claiming. Fails on a backstop without owners:
/// a's claim of the next period is Claimed and fences b's token out.
#[tokio::test]
async fn another_namespace_can_neither_claim_nor_fence_a_job_key() {
    let prefix = unique_prefix("owner");
    let b = backstop(&prefix);
    let (victim, thief) = (tenant("b"), tenant("a"));

    assert_eq!(
        claim(&b, "2027-01-01T00:00:00Z", 1, &victim).await,
        ClaimOutcome::Claimed
    );
    assert_eq!(stored_owner(&prefix).await.as_deref(), Some("b"));
    let refused = ClaimOutcome::NotOwner { owner: "b".into() };
    assert_eq!(claim(&b, "2027-01-01T00:00:02Z", 2, &thief).await, refused);
    assert_eq!(
        claim(&b, "2027-01-01T00:00:00Z", 2, &thief).await,
        refused,
        "b's own period: refused before its row is read"
    );
    assert_eq!(b.fence(VICTIM).await.unwrap(), 1, "nothing changed");
    assert!(
        b.claimed(VICTIM, ts("2027-01-01T00:00:02Z"))
            .await
            .unwrap()
            .is_none()
    );
    for e in [
        b.retire(VICTIM, 2, "a").await.unwrap_err(),
        b.retire(VICTIM, 1, "a").await.unwrap_err(),
        b.retire_unstarted(VICTIM, 1, "a").await.unwrap_err(),
        b.withdraw(
            VICTIM,
            ts("2027-01-01T00:00:00Z"),
            1,
            "a",
            crate::backstop::withdrawal::BACKSTOP_OUTAGE,
        )
        .await
        .unwrap_err(),
    ] {
        assert!(matches!(e, Error::NotOwner { .. }), "{e:?}");
        assert!(!e.to_string().contains("\"b\""), "names no owner: {e}");
    }
    assert_eq!(
        (
            b.fence(VICTIM).await.unwrap(),
            b.retired(VICTIM).await.unwrap()
        ),
        (1, 0)
    );
    assert!(
        b.claimed(VICTIM, ts("2027-01-01T00:00:00Z"))
            .await
            .unwrap()
            .is_some()
    );
    // b itself goes on: its next period, and its own retirement.
    assert_eq!(
        claim(&b, "2027-01-01T00:00:02Z", 2, &victim).await,
        ClaimOutcome::Claimed
    );
    b.retire(VICTIM, 2, "b").await.unwrap();
    assert_eq!(b.retired(VICTIM).await.unwrap(), 2);
    cleanup(&prefix).await;
}

/// An administrator shares a key with every namespace (`*`) or moves it to another; a key
/// from before schema 6 (no owner) is recorded by its next claim; a claimer that names no
/// namespace (a library caller) neither records nor is checked.
#[tokio::test]
async fn owners_are_recorded_by_the_first_claim_and_changed_by_an_administrator() {
    let prefix = unique_prefix("ownadm");
    let p = prefix.as_str();
    let b = backstop(&prefix);
    assert_eq!(
        claim(&b, "2027-01-01T00:00:00Z", 1, &Claimer::default()).await,
        ClaimOutcome::Claimed
    );
    assert_eq!(stored_owner(&prefix).await, None, "nobody named");
    assert_eq!(
        claim(&b, "2027-01-01T00:00:02Z", 2, &tenant("b")).await,
        ClaimOutcome::Claimed
    );
    assert_eq!(stored_owner(&prefix).await.as_deref(), Some("b"), "adopted");

    let admin = workload().await;
    let set = format!("UPDATE {p}fences SET namespace = $2 WHERE job = $1");
    admin.execute(&set, &[&VICTIM, &SHARED]).await.unwrap();
    assert_eq!(
        claim(&b, "2027-01-01T00:00:04Z", 3, &tenant("a")).await,
        ClaimOutcome::Claimed,
        "shared"
    );
    assert_eq!(stored_owner(&prefix).await.as_deref(), Some(SHARED), "kept");
    admin.execute(&set, &[&VICTIM, &"c"]).await.unwrap();
    assert_eq!(
        claim(&b, "2027-01-01T00:00:06Z", 4, &tenant("b")).await,
        ClaimOutcome::NotOwner { owner: "c".into() },
        "moved"
    );
    assert_eq!(
        claim(&b, "2027-01-01T00:00:06Z", 4, &tenant("c")).await,
        ClaimOutcome::Claimed
    );
    // A key reserved before its first claim.
    let reserved = "c/reserved";
    admin
        .execute(
            &format!("INSERT INTO {p}fences (job, token, namespace) VALUES ($1, 0, 'c')"),
            &[&reserved],
        )
        .await
        .unwrap();
    let at = ts("2027-01-01T00:00:00Z");
    for (ns, expected) in [
        ("a", ClaimOutcome::NotOwner { owner: "c".into() }),
        ("c", ClaimOutcome::Claimed),
    ] {
        let got = b
            .claim_as(reserved, at, 1, "reserved-run", None, &tenant(ns))
            .await
            .unwrap();
        assert_eq!(got, expected, "{ns}");
    }
    cleanup(&prefix).await;
}

/// Two namespaces' first claims of one key, racing: both find no owner recorded, both wait on
/// the fence row (held by a workload's transaction), and exactly one wins; the other is refused
/// whichever order the row's lock lets them in.
#[tokio::test]
async fn racing_first_claims_of_two_namespaces_leave_one_owner() {
    let prefix = unique_prefix("ownrace");
    let p = prefix.as_str();
    let b = backstop(&prefix);
    // A row without an owner (as before schema 6), then its lock held open.
    assert_eq!(
        claim(&b, "2027-01-01T00:00:00Z", 1, &Claimer::default()).await,
        ClaimOutcome::Claimed
    );
    let mut holder = workload().await;
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        &format!("SELECT 1 FROM {p}fences WHERE job = $1 FOR UPDATE"),
        &[&VICTIM],
    )
    .await
    .unwrap();
    let (ba, bb) = (backstop(&prefix), backstop(&prefix));
    let (ta, tb) = (tenant("a"), tenant("b"));
    let a = claim(&ba, "2027-01-01T00:00:02Z", 2, &ta);
    let b2 = claim(&bb, "2027-01-01T00:00:04Z", 3, &tb);
    let release = async {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        tx.commit().await.unwrap();
    };
    let (a, b2, ()) = tokio::join!(a, b2, release);
    let owner = stored_owner(&prefix).await.expect("an owner recorded");
    let (won, lost) = if owner == "a" { (a, b2) } else { (b2, a) };
    assert_eq!(won, ClaimOutcome::Claimed, "owner {owner}");
    assert_eq!(lost, ClaimOutcome::NotOwner { owner }, "the other one");
    cleanup(&prefix).await;
}

/// Multi-cluster keeps working: the same namespace in two clusters is one owner. (Past periods:
/// with a cluster identity a scheduled period is due by the database's clock.)
#[tokio::test]
async fn the_same_namespace_in_another_cluster_is_the_same_owner() {
    let prefix = unique_prefix("owndr");
    let b = backstop(&prefix);
    let in_cluster = |id: &str, ns: &str| Claimer {
        namespace: ns.into(),
        ..cluster(id, None, None)
    };
    assert_eq!(
        claim(
            &b,
            "2026-01-01T00:00:00Z",
            1,
            &in_cluster("east", "billing")
        )
        .await,
        ClaimOutcome::Claimed
    );
    assert_eq!(
        claim(
            &b,
            "2026-01-01T00:00:02Z",
            2,
            &in_cluster("west", "billing")
        )
        .await,
        ClaimOutcome::Claimed
    );
    assert_eq!(
        claim(
            &b,
            "2026-01-01T00:00:04Z",
            3,
            &in_cluster("west", "billing-dr")
        )
        .await,
        ClaimOutcome::NotOwner {
            owner: "billing".into()
        }
    );
    cleanup(&prefix).await;
}
