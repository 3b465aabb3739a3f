//! The checker of the two-cluster (`dr-*`) scenarios: pure functions from what both clusters'
//! API servers and the shared claims table showed to one row of the chaos table. The job is one
//! (one `jobKey`) across clusters, so its Jobs are counted per period across both API servers:
//! the single-cluster checks of [`super::check::evaluate`] run over the union (among them: no run
//! without a claim row, no Job before its instant), and the cross-cluster ones (the claim names
//! the cluster that ran, tokens in order across clusters) here.
//!
//! A period recorded `ClaimedElsewhere` by one cluster says only that another cluster has it; it
//! explains no missing run. A due period with no Job in either cluster must be recorded by some
//! cluster with another outcome (Missed, Skipped), else it is lost.
//!
//! Tokens: the fence makes every claim's token higher than every claim committed before it
//! (docs/multi-cluster.md), each cluster claims its periods in order, and a scheduled claim of a
//! period older than another cluster's claim is refused (Superseded). So tokens rise with the
//! period, within each cluster and across them; a claim row whose token is below an earlier
//! period's row of the other cluster is a violation (counted with the non-monotonic tokens).

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use super::check::{
    Claim, CommittedAttempt, Expect, FaultWindow, JobSeen, Observations, Proof, Recorded, Row,
    SjObservation, Write, evaluate_tokens,
};

/// The reason that only points at another cluster.
pub const CLAIMED_ELSEWHERE: &str = "ClaimedElsewhere";

/// A row of the shared claims table, with the cluster it names.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterClaim {
    pub period: Timestamp,
    pub token: u64,
    pub cluster: String,
    pub confirmed: bool,
}

/// A Job of the job, seen in `cluster`'s API server.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterJob {
    pub cluster: String,
    /// With its `created` (`metadata.creationTimestamp`, the API server's clock) when the watch
    /// saw it.
    pub job: JobSeen,
}

/// What one cluster's SingletonJob recorded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterRecord {
    pub cluster: String,
    /// `status.decidedThrough`.
    pub decided_through: Option<Timestamp>,
    /// Periods decided without a Job in this cluster, `ClaimedElsewhere` included.
    pub recorded: Vec<Recorded>,
}

/// Everything a two-cluster scenario observed of its one job.
#[derive(Clone, Debug, Default)]
pub struct DrObservations {
    /// The `jobKey`.
    pub key: String,
    pub due: Vec<Timestamp>,
    pub claims: Vec<ClusterClaim>,
    pub jobs: Vec<ClusterJob>,
    pub clusters: Vec<ClusterRecord>,
    pub writes: Vec<Write>,
    /// From the fault to the other cluster running a period (takeover).
    pub takeovers: Vec<Duration>,
    pub watch_relists: u64,
    pub watch_errors: u64,
    pub events_only: Vec<String>,
    /// The schedule's interval.
    pub interval: Duration,
    /// When the fault was on, when the check read all this, and the row's settle time (see
    /// [`Observations`]).
    pub fault: Option<FaultWindow>,
    pub checked_at: Option<Timestamp>,
    pub settle: Duration,
    /// Committed attempts of the workload (None: n/a).
    pub attempts: Option<Vec<CommittedAttempt>>,
    /// Evidence that the fault fired.
    pub proofs: Vec<Proof>,
}

/// The single-cluster view of the union: one SingletonJob (with a backstop: every run needs its
/// claim row) whose Jobs are those of every cluster, whose decisions count only where they
/// explain a missing run, and which is decided through a period only once every cluster that
/// has decided anything is (a cluster without `decidedThrough` no longer makes every period
/// pending: pending is bounded by the check's time anyway).
pub fn merged(obs: &DrObservations) -> Observations {
    let recorded = obs
        .clusters
        .iter()
        .flat_map(|c| c.recorded.iter())
        .filter(|r| r.reason != CLAIMED_ELSEWHERE)
        .cloned()
        .collect();
    let decided_through = obs.clusters.iter().filter_map(|c| c.decided_through).min();
    Observations {
        sjs: vec![SjObservation {
            key: obs.key.clone(),
            backstop: true,
            interval: obs.interval,
            due: obs.due.clone(),
            decided_through,
            claims: obs
                .claims
                .iter()
                .map(|c| Claim {
                    period: c.period,
                    token: c.token,
                })
                .collect(),
            jobs: obs.jobs.iter().map(|j| j.job.clone()).collect(),
            recorded,
        }],
        writes: obs.writes.clone(),
        attempts: obs.attempts.clone(),
        failovers: obs.takeovers.clone(),
        hung: Vec::new(),
        watch_relists: obs.watch_relists,
        watch_errors: obs.watch_errors,
        events_only: obs.events_only.clone(),
        unattributed: Vec::new(),
        fault: obs.fault,
        checked_at: obs.checked_at,
        settle: obs.settle,
        proofs: obs.proofs.clone(),
    }
}

/// The row: the common checks over both clusters' Jobs, then the cross-cluster ones.
pub fn evaluate_dr(
    scenario: &str,
    fault_window: Duration,
    expect: &Expect,
    obs: &DrObservations,
) -> Row {
    let mut row = evaluate_tokens(scenario, fault_window, expect, &merged(obs), false);
    let out_of_order = per_cluster_token_order(obs);
    row.non_monotonic += out_of_order.len() as u64;
    row.details.extend(out_of_order);
    row.details.extend(claim_cluster_mismatches(obs));
    row.notes.push(split(obs));
    if let Some(why) = not_run_reasons(obs) {
        row.notes.push(why);
    }
    let inversions = cross_cluster_inversions(obs);
    row.non_monotonic += inversions.len() as u64;
    row.details.extend(inversions);
    row
}

/// Within each cluster, the tokens of its Jobs that ran must rise with the period.
pub fn per_cluster_token_order(obs: &DrObservations) -> Vec<String> {
    let mut by_cluster: BTreeMap<&str, BTreeMap<Timestamp, u64>> = BTreeMap::new();
    for j in obs.jobs.iter().filter(|j| j.job.ran) {
        if let Some(t) = j.job.token {
            let e = by_cluster
                .entry(&j.cluster)
                .or_default()
                .entry(j.job.period)
                .or_insert(t);
            *e = (*e).min(t);
        }
    }
    let mut out = Vec::new();
    for (cluster, tokens) in by_cluster {
        let mut last: Option<(Timestamp, u64)> = None;
        for (p, t) in tokens {
            if let Some((lp, lt)) = last
                && t <= lt
            {
                out.push(format!(
                    "{} in {cluster}: token {t} of period {p} not above token {lt} of earlier period {lp}",
                    obs.key
                ));
            }
            last = Some((p, t));
        }
    }
    out
}

/// Claim rows whose token is not below that of a later period's row of another cluster: the
/// period was claimed after the later one (a standby after its delay, a cluster behind by its
/// clock), which the claim transaction must refuse. Within one cluster the order is checked by
/// [`per_cluster_token_order`].
pub fn cross_cluster_inversions(obs: &DrObservations) -> Vec<String> {
    let mut claims: Vec<&ClusterClaim> = obs.claims.iter().collect();
    claims.sort_by_key(|c| c.period);
    let mut highest: Option<&ClusterClaim> = None;
    let mut out = Vec::new();
    for c in claims {
        match highest {
            Some(h) if c.token <= h.token && c.cluster != h.cluster => out.push(format!(
                "{}: period {} claimed by {} with token {}, not below token {} of the later period {} claimed by {}",
                obs.key, h.period, h.cluster, h.token, c.token, c.period, c.cluster
            )),
            Some(h) if c.token <= h.token => {}
            _ => highest = Some(c),
        }
    }
    out
}

/// Periods whose one Job that ran is in a cluster other than the one its claim row names (or
/// whose claim row is unconfirmed): the claims table must say who ran each period. (A missing
/// claim row is a run without a claim, counted by the common check.)
pub fn claim_cluster_mismatches(obs: &DrObservations) -> Vec<String> {
    let claims: BTreeMap<Timestamp, &ClusterClaim> =
        obs.claims.iter().map(|c| (c.period, c)).collect();
    let mut out = Vec::new();
    for (period, ran) in ran_in(obs) {
        let [cluster] = ran.as_slice() else {
            continue; // Two or none: counted by the common checks.
        };
        match claims.get(&period) {
            Some(c) if c.cluster == *cluster && c.confirmed => {}
            Some(c) => out.push(format!(
                "{} period {period} ran in {cluster}, but its claim row names {} (token {}, confirmed {})",
                obs.key, c.cluster, c.token, c.confirmed
            )),
            None => {}
        }
    }
    out
}

/// Period -> the clusters in which a Job of it ran (one entry per Job uid).
pub fn ran_in(obs: &DrObservations) -> BTreeMap<Timestamp, Vec<String>> {
    let mut by: BTreeMap<Timestamp, BTreeMap<&str, &str>> = BTreeMap::new();
    for j in obs.jobs.iter().filter(|j| j.job.ran) {
        by.entry(j.job.period)
            .or_default()
            .insert(&j.job.uid, &j.cluster);
    }
    by.into_iter()
        .map(|(p, uids)| (p, uids.into_values().map(str::to_string).collect()))
        .collect()
}

/// Due periods run per cluster, and what each cluster recorded `ClaimedElsewhere`.
pub fn split(obs: &DrObservations) -> String {
    let ran = ran_in(obs);
    let parts: Vec<String> = obs
        .clusters
        .iter()
        .map(|c| {
            let runs = obs
                .due
                .iter()
                .filter(|p| ran.get(p).is_some_and(|cs| cs.contains(&c.cluster)))
                .count();
            let elsewhere = obs
                .due
                .iter()
                .filter(|p| {
                    c.recorded
                        .iter()
                        .any(|r| r.reason == CLAIMED_ELSEWHERE && r.first <= **p && **p <= r.last)
                })
                .count();
            format!(
                "{} ran {runs}, recorded {elsewhere} ClaimedElsewhere",
                c.cluster
            )
        })
        .collect();
    format!("due periods by cluster: {}", parts.join("; "))
}

/// Why the due periods that ran nowhere were not run: outcome (reason) and cluster, counted.
pub fn not_run_reasons(obs: &DrObservations) -> Option<String> {
    let ran = ran_in(obs);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for p in obs.due.iter().filter(|p| !ran.contains_key(p)) {
        let why = obs.clusters.iter().find_map(|c| {
            c.recorded
                .iter()
                .find(|r| r.reason != CLAIMED_ELSEWHERE && r.first <= *p && *p <= r.last)
                .map(|r| format!("{} ({}) in {}", r.outcome, r.reason, c.cluster))
        });
        *counts
            .entry(why.unwrap_or_else(|| "nothing recorded".to_string()))
            .or_default() += 1;
    }
    if counts.is_empty() {
        return None;
    }
    let parts: Vec<String> = counts.iter().map(|(w, n)| format!("{n} {w}")).collect();
    Some(format!("due periods run nowhere: {}", parts.join(", ")))
}

/// The first period that ran in `cluster` after `since`, and when its Job was created.
pub fn first_run_in(
    obs: &DrObservations,
    cluster: &str,
    since: Timestamp,
) -> Option<(Timestamp, Option<Timestamp>)> {
    obs.jobs
        .iter()
        .filter(|j| j.cluster == cluster && j.job.ran && j.job.period > since)
        .min_by_key(|j| j.job.period)
        .map(|j| (j.job.period, j.job.created))
}

#[cfg(test)]
mod tests {
    use super::super::check::WriteResult;
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn job(cluster: &str, period: Timestamp, token: u64, uid: &str) -> ClusterJob {
        ClusterJob {
            cluster: cluster.into(),
            job: JobSeen {
                uid: uid.into(),
                name: format!("dr-{}", period.as_second()),
                period,
                token: Some(token),
                ran: true,
                removed: true,
                events_only: false,
                created: Some(period + jiff::SignedDuration::from_millis(300)),
                ended: Some(period + jiff::SignedDuration::from_millis(1300)),
                unreleased: false,
                released: None,
                resume_at: None,
                withdrawn: None,
                command: None,
            },
        }
    }

    fn claim(cluster: &str, period: Timestamp, token: u64) -> ClusterClaim {
        ClusterClaim {
            period,
            token,
            cluster: cluster.into(),
            confirmed: true,
        }
    }

    fn elsewhere(p: Timestamp) -> Recorded {
        Recorded {
            first: p,
            last: p,
            outcome: "Deduplicated".into(),
            reason: CLAIMED_ELSEWHERE.into(),
        }
    }

    /// Periods 0..=10 every 2 s: west runs 0..=4, east 6..=10 (a takeover), each recorded
    /// ClaimedElsewhere by the other; tokens rising across the clusters.
    fn healthy() -> DrObservations {
        let due: Vec<Timestamp> = (0..=5).map(|i| t(2 * i)).collect();
        let who = |i: i64| if i < 3 { "west" } else { "east" };
        let other = |i: i64| if i < 3 { "east" } else { "west" };
        let mut obs = DrObservations {
            key: "dr/k".into(),
            due: due.clone(),
            clusters: vec![
                ClusterRecord {
                    cluster: "east".into(),
                    decided_through: Some(t(10)),
                    recorded: vec![],
                },
                ClusterRecord {
                    cluster: "west".into(),
                    decided_through: Some(t(10)),
                    recorded: vec![],
                },
            ],
            interval: Duration::from_secs(2),
            fault: Some(FaultWindow {
                from: t(3),
                to: t(7),
                recovered: Some(t(7)),
            }),
            checked_at: Some(t(14)),
            settle: Duration::from_secs(3),
            proofs: vec![Proof::new(
                true,
                "the primary's API server refused connections",
            )],
            ..DrObservations::default()
        };
        for i in 0..=5 {
            let (p, token) = (t(2 * i), 10 * i as u64 + 1);
            obs.claims.push(claim(who(i), p, token));
            obs.jobs.push(job(who(i), p, token, &format!("uid-{i}")));
            let c = obs
                .clusters
                .iter_mut()
                .find(|c| c.cluster == other(i))
                .unwrap();
            c.recorded.push(elsewhere(p));
            obs.writes.push(Write {
                job: "dr/k".into(),
                period: p,
                token,
                held: false,
                result: WriteResult::Accepted { seq: i + 1 },
            });
        }
        obs
    }

    fn expect() -> Expect {
        Expect {
            reasons: &["Superseded", "DeadlineExceeded"],
            min_due_in_fault: 1,
            ..Expect::default()
        }
    }

    fn evaluate(obs: &DrObservations) -> Row {
        evaluate_dr("dr-test", Duration::ZERO, &expect(), obs)
    }

    fn violations(obs: &DrObservations) -> Vec<String> {
        evaluate(obs).violations(expect())
    }

    #[test]
    fn one_run_per_period_across_clusters_passes() {
        let obs = healthy();
        let row = evaluate(&obs);
        assert_eq!((row.due, row.started, row.jobs_per_period_max), (6, 6, 1));
        assert!(violations(&obs).is_empty(), "{:?}", violations(&obs));
        assert!(row.notes.iter().any(|n| n.contains(
            "east ran 3, recorded 3 ClaimedElsewhere; west ran 3, recorded 3 ClaimedElsewhere"
        )));
    }

    #[test]
    fn a_period_run_in_both_clusters_fails() {
        let mut obs = healthy();
        // West ran period 6 too, with its own (lower) token: two Jobs across the API servers.
        obs.jobs.push(job("west", t(6), 30, "uid-west-again"));
        let row = evaluate(&obs);
        assert_eq!(row.jobs_per_period_max, 2);
        let v = violations(&obs);
        assert!(
            v.iter().any(|d| d.contains("Jobs per period (max) is 2")),
            "{v:?}"
        );
        assert!(v.iter().any(|d| d.contains("uid-west-again")), "{v:?}");
    }

    #[test]
    fn a_period_with_no_job_explained_only_by_claimed_elsewhere_is_lost() {
        let mut obs = healthy();
        // West confirmed period 2 and never created its Job; east says ClaimedElsewhere.
        obs.jobs.retain(|j| j.job.period != t(2));
        obs.writes.retain(|w| w.period != t(2));
        let row = evaluate(&obs);
        assert_eq!((row.lost, row.started), (1, 5));
        assert!(
            violations(&obs)
                .iter()
                .any(|d| d.contains("no recorded reason"))
        );
        // Recorded Missed by the cluster that had it: an outcome, no violation.
        obs.clusters[1].recorded.push(Recorded {
            first: t(2),
            last: t(2),
            outcome: "Missed".into(),
            reason: "DeadlineExceeded".into(),
        });
        let row = evaluate(&obs);
        assert_eq!((row.lost, row.recorded), (0, 1));
        assert!(
            row.notes
                .iter()
                .any(|n| n == "due periods run nowhere: 1 Missed (DeadlineExceeded) in west"),
            "{:?}",
            row.notes
        );
        assert!(violations(&obs).is_empty(), "{:?}", violations(&obs));
    }

    #[test]
    fn a_period_is_pending_until_every_cluster_decided_it() {
        let mut obs = healthy();
        obs.jobs.retain(|j| j.job.period != t(10));
        obs.writes.retain(|w| w.period != t(10));
        obs.clusters[0].decided_through = Some(t(8));
        let row = evaluate(&obs);
        assert_eq!((row.pending, row.lost), (1, 0));
    }

    #[test]
    fn a_cluster_without_decided_through_no_longer_makes_every_period_pending() {
        // West ran nothing for period 4 and recorded nothing; east never set decidedThrough.
        // Before, min() over the clusters was None and every period counted as pending.
        let mut obs = healthy();
        obs.jobs.retain(|j| j.job.period != t(4));
        obs.writes.retain(|w| w.period != t(4));
        obs.clusters[0].decided_through = None;
        let row = evaluate(&obs);
        assert_eq!((row.pending, row.lost), (0, 1));
    }

    #[test]
    fn a_run_in_the_cluster_the_claim_does_not_name_fails() {
        let mut obs = healthy();
        obs.claims[1].cluster = "east".into();
        let v = violations(&obs);
        assert!(
            v.iter()
                .any(|d| d.contains("ran in west, but its claim row names east")),
            "{v:?}"
        );
        let mut obs = healthy();
        obs.claims[1].confirmed = false;
        assert!(
            violations(&obs)
                .iter()
                .any(|d| d.contains("confirmed false"))
        );
        let mut obs = healthy();
        obs.claims.remove(1);
        assert!(
            violations(&obs)
                .iter()
                .any(|d| d.contains("without a claim row"))
        );
    }

    #[test]
    fn a_job_created_before_its_instant_fails() {
        let mut obs = healthy();
        obs.jobs[4].job.created = Some(t(8) - jiff::SignedDuration::from_secs(40));
        let v = violations(&obs);
        assert!(
            v.iter()
                .any(|d| d.contains("period 2027-01-15T08:00:08Z started early")),
            "{v:?}"
        );
    }

    #[test]
    fn tokens_must_rise_with_the_period_within_a_cluster() {
        let mut obs = healthy();
        // East's period 8 with a token below its own period 6.
        obs.claims[4].token = 25;
        obs.jobs[4].job.token = Some(25);
        obs.writes.clear();
        let row = evaluate(&obs);
        assert_eq!(row.non_monotonic, 1, "{row:?}");
        let v = violations(&obs);
        assert!(
            v.iter().any(|d| d.contains("in east: token 25 of period")),
            "{v:?}"
        );
    }

    #[test]
    fn a_period_claimed_after_a_later_one_in_the_other_cluster_fails() {
        let mut obs = healthy();
        // East (standby) claimed period 6 after west had claimed period 8 (token 41).
        obs.claims[3].token = 45;
        obs.jobs[3].job.token = Some(45);
        obs.claims[4].cluster = "west".into();
        obs.jobs[4].cluster = "west".into();
        obs.writes.clear();
        let row = evaluate(&obs);
        assert_eq!(row.non_monotonic, 1, "{row:?}");
        let v = violations(&obs);
        assert!(
            v.iter()
                .any(|d| d.contains("claimed by east with token 45, not below token 41")),
            "{v:?}"
        );
    }

    #[test]
    fn the_first_run_after_a_fault_is_found_per_cluster() {
        let obs = healthy();
        let (p, created) = first_run_in(&obs, "east", t(1)).unwrap();
        assert_eq!(p, t(6));
        assert!(created.is_some());
        assert_eq!(first_run_in(&obs, "west", t(4)), None);
    }
}
