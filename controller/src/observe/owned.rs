//! What a SingletonJob's own Jobs say, held against its status: pure functions of the status and
//! the Jobs (from the cache), so every rule is unit-tested without an API server.
//!
//! Three questions, each a layer of the defence against a period running twice (G1):
//! - [`to_resume`]: runs whose claim was confirmed but whose Job was never resumed (the replica
//!   that confirmed died first). Their Job is the period's one Job: resume it.
//! - [`unknown`]: Jobs of decided periods that no claim knows (a paused replica's late create, a
//!   deposed leader's leftovers). The last line of defence: remove them by uid.
//! - [`behind`]: status older than the Jobs it created (wiped by hand, or an etcd restore). The
//!   Jobs' labels give lower bounds for the token and the cursor; below them a period would run
//!   again.

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;

use crate::api::{RunRef, SingletonJob, SingletonJobStatus};
use crate::naming;

/// One Job owned by the SingletonJob, as far as the protocol cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedJob {
    pub name: String,
    pub uid: String,
    /// From its `singleton.dev/period` annotation.
    pub period: Option<Timestamp>,
    /// From its `singleton.dev/fencing-token` annotation.
    pub token: Option<u64>,
    /// `spec.suspend`: it may not run pods (created so, and not yet resumed).
    pub suspended: bool,
    /// It completed or failed.
    pub finished: bool,
    /// Being deleted (a deletionTimestamp): going away already.
    pub deleting: bool,
    /// Its `singleton.dev/released` annotation.
    pub release: Release,
    /// Its `singleton.dev/resume-at` annotation: a prepared run's Job, never resumed before it.
    pub resume_at: Option<Timestamp>,
}

/// What a Job's `singleton.dev/released` annotation says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// No mark: a Job of a controller before issue 31 (never judged by it).
    Unmarked,
    /// Created suspended, not released by the controller yet.
    NotReleased,
    /// Released by the controller after its confirm (the value is the run's token).
    Released,
    /// A prepared run withdrawn before its instant, with the reason it carries: it never ran
    /// and may never be resumed (a resume tests for [`Release::NotReleased`]).
    Withdrawn(String),
}

impl Release {
    /// Whether the controller has not released the Job (nor withdrawn it): it may still be let run.
    pub fn pending(&self) -> bool {
        matches!(self, Release::Unmarked | Release::NotReleased)
    }
}

impl OwnedJob {
    /// The Job, if `owner_uid` owns it and it has a uid.
    pub fn of(job: &Job, owner_uid: &str) -> Option<OwnedJob> {
        if !job.owner_references().iter().any(|o| o.uid == owner_uid) {
            return None;
        }
        let annotations = job.metadata.annotations.as_ref();
        let finished = job
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
            });
        Some(OwnedJob {
            name: job.name_any(),
            uid: job.metadata.uid.clone()?,
            period: annotations
                .and_then(|a| a.get(naming::LABEL_PERIOD))
                .and_then(|p| p.parse().ok()),
            token: crate::job::token(job),
            suspended: job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false),
            finished,
            deleting: job.metadata.deletion_timestamp.is_some(),
            release: match annotations.and_then(|a| a.get(naming::ANNOTATION_RELEASED)) {
                None => Release::Unmarked,
                Some(v) if v == naming::NOT_RELEASED => Release::NotReleased,
                Some(v) if v == naming::WITHDRAWN => Release::Withdrawn(
                    annotations
                        .and_then(|a| a.get(naming::ANNOTATION_WITHDRAWN))
                        .cloned()
                        .unwrap_or_default(),
                ),
                Some(_) => Release::Released,
            },
            resume_at: annotations
                .and_then(|a| a.get(naming::ANNOTATION_RESUME_AT))
                .and_then(|p| p.parse().ok()),
        })
    }
}

/// The Jobs `sj` owns, from a list of Jobs (the cache).
pub fn owned<'a>(sj: &SingletonJob, jobs: impl IntoIterator<Item = &'a Job>) -> Vec<OwnedJob> {
    let Some(uid) = sj.metadata.uid.as_deref() else {
        return Vec::new();
    };
    let ns = sj.metadata.namespace.as_deref();
    jobs.into_iter()
        .filter(|j| j.metadata.namespace.as_deref() == ns)
        .filter_map(|j| OwnedJob::of(j, uid))
        .collect()
}

/// Whether a claim of `status` knows `job`: the pending claim (by name and token: its Job's uid
/// is not recorded until the confirm), a run it replaces, an active run or the prepared run (by
/// uid).
pub fn known(status: &SingletonJobStatus, job: &OwnedJob) -> bool {
    let pending = status.pending_claim.as_ref().is_some_and(|p| {
        (p.job_name == job.name && Some(p.token) == job.token)
            || p.replaces.iter().any(|r| r.job_name == job.name)
    });
    pending
        || status
            .active
            .iter()
            .chain(status.prepared.as_ref())
            .any(|r| runs_as(r, job))
}

/// Whether `job` is a prepared run's Job that has not run: created ahead of its instant
/// (`singleton.dev/resume-at`) and not released. Its period is not decided by it.
pub fn unrun_prepared(job: &OwnedJob) -> bool {
    job.resume_at.is_some() && !matches!(job.release, Release::Released)
}

/// Whether active run `r` is `job`: by uid, or by name and token for a run recorded without one.
fn runs_as(r: &RunRef, job: &OwnedJob) -> bool {
    match &r.job_uid {
        Some(uid) => *uid == job.uid,
        None => r.job_name == job.name && Some(r.token) == job.token,
    }
}

/// Active runs whose Job was never released: their confirm was written, their resume (or queue
/// release) was not. A Job released to its queue stays suspended until the queue admits it: it
/// is not released again. The prepared run is not among them (it is resumed at its instant,
/// after its judge, by `run::prepared`), nor a withdrawn Job, nor a Job whose
/// `singleton.dev/resume-at` is after `due_now` (the earliest time the API server's clock may
/// show): an active run carrying one was adopted by a status that did not know it was prepared,
/// and resuming it now would start it early (G4).
pub fn to_resume(
    status: &SingletonJobStatus,
    jobs: &[OwnedJob],
    due_now: Timestamp,
) -> Vec<(String, String)> {
    status
        .active
        .iter()
        .filter_map(|r| {
            let job = jobs.iter().find(|j| runs_as(r, j))?;
            let early = job.resume_at.is_some_and(|at| at > due_now);
            (job.suspended && job.release.pending() && !early && !job.finished && !job.deleting)
                .then(|| (job.name.clone(), job.uid.clone()))
        })
        .collect()
}

/// Runs a claim knows (pending, active or prepared) whose Job runs, or ran, without the
/// controller's release: a webhook, a queue or a person unsuspended it, possibly before its claim
/// was confirmed, or before its instant, or after it was withdrawn. Only the controller starts a
/// run (G1): each is stopped and its period decided (StartedBeforeConfirm). Jobs of a controller
/// before issue 31 carry no mark and are not judged.
pub fn started_outside<'a>(
    status: &SingletonJobStatus,
    jobs: &'a [OwnedJob],
) -> Vec<(RunRef, &'a OwnedJob)> {
    let pending = status.pending_claim.iter().filter_map(|p| {
        let job = jobs
            .iter()
            .find(|j| j.name == p.job_name && j.token == Some(p.token))?;
        Some((p.clone(), job))
    });
    let active = status
        .active
        .iter()
        .chain(status.prepared.as_ref())
        .filter_map(|r| Some((r.clone(), jobs.iter().find(|j| runs_as(r, j))?)));
    pending
        .chain(active)
        .filter(|(_, j)| {
            !j.suspended
                && matches!(j.release, Release::NotReleased | Release::Withdrawn(_))
                && !j.deleting
        })
        .collect()
}

/// Jobs no claim knows, of periods `status` has decided, that may run or still could: a
/// suspended one never ran and must never be resumed; a running one is a second run of a period
/// that had one. Finished Jobs are left to the history limits, and a Job carrying a token above
/// every token the status knows is not unknown but news: the status is behind ([`behind`]).
/// Whatever their period: a withdrawn prepared run's Job (its deletion was lost), and a prepared
/// Job no claim knows whose token the status has issued (a paused preparer's late create after
/// its preparation was withdrawn: its claim can never be confirmed).
pub fn unknown<'a>(status: &SingletonJobStatus, jobs: &'a [OwnedJob]) -> Vec<&'a OwnedJob> {
    jobs.iter()
        .filter(|j| !j.finished && !j.deleting && !known(status, j))
        .filter(|j| {
            let issued = j.token.is_some_and(|t| t <= status.fencing_token);
            matches!(j.release, Release::Withdrawn(_))
                || (issued && (decided(status, j) || unrun_prepared(j)))
        })
        .collect()
}

/// Whether the period of `job` is decided by `status`: a scheduled period at or before the
/// cursor, or a manual one (its token was issued before this status, so its claim was decided).
fn decided(status: &SingletonJobStatus, job: &OwnedJob) -> bool {
    match job.period {
        Some(p) if naming::is_manual(p) => true,
        Some(p) => status.decided_through.as_ref().is_some_and(|c| p <= c.0),
        None => false,
    }
}

/// Whether any record of the status or a Job of `jobs` says `period` ran (or was deduplicated
/// as having run): a backfill must not start it again, whatever the claims table says.
pub fn ran(status: &SingletonJobStatus, jobs: &[OwnedJob], period: Timestamp) -> bool {
    let in_history = status.history.iter().any(|h| {
        h.period.0 == period
            && (h.job_name.is_some() || h.outcome == crate::api::Outcome::Deduplicated)
    });
    let in_runs = status
        .active
        .iter()
        .chain(status.pending_claim.as_ref())
        .any(|r| r.period.0 == period);
    in_history || in_runs || jobs.iter().any(|j| j.period == Some(period))
}

/// How far the Jobs show the status to be behind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Behind {
    /// The highest token a Job carries, when above `status.fencingToken`.
    pub token: Option<u64>,
    /// The latest scheduled period a Job ran for, when after `status.decidedThrough`.
    pub decided_through: Option<Timestamp>,
    /// Jobs still running (or still to be resumed, never) that no active run names: adopted as
    /// active so that Forbid waits for them and their outcome is recorded.
    pub running: Vec<RunRef>,
    /// A prepared run's Job carrying the highest token, not run yet, that the status does not
    /// know: adopted as `status.prepared` (never as running: that would resume it early), with
    /// no basis, so its judge withdraws it (StatusBehind) unless it was resumed meanwhile.
    pub prepared: Option<RunRef>,
}

/// Whether the owned Jobs carry a token or a period that `status` does not know of (it was wiped
/// or restored from an older copy); then, the bounds to raise it to. Tokens and periods only move
/// forward, so a Job's labels are lower bounds for both.
pub fn behind(status: &SingletonJobStatus, jobs: &[OwnedJob]) -> Option<Behind> {
    let max_token = jobs.iter().filter_map(|j| j.token).max();
    // A prepared Job that has not run decides nothing: its period is still to be judged.
    let max_period = jobs
        .iter()
        .filter(|j| !unrun_prepared(j))
        .filter_map(|j| j.period)
        .filter(|p| !naming::is_manual(*p))
        .max();
    let token = max_token.filter(|t| *t > status.fencing_token);
    let decided_through =
        max_period.filter(|p| status.decided_through.as_ref().is_none_or(|c| *p > c.0));
    if token.is_none() && decided_through.is_none() {
        return None;
    }
    // A suspended Job may be a confirmed run not resumed yet (its queue has not admitted it):
    // only the newest claim's can have been confirmed, so the Job carrying the highest token is
    // adopted suspended or not (F5), and resumed or released as any confirmed run; older
    // suspended Jobs never ran and are left to the sweep.
    let unknown_live = |j: &&OwnedJob| !j.finished && !j.deleting && !known(status, j);
    let prepared = jobs
        .iter()
        .filter(unknown_live)
        .filter(|j| j.release == Release::NotReleased && j.resume_at.is_some())
        .filter(|j| token.is_some() && j.token == max_token && status.prepared.is_none())
        .find_map(|j| {
            let mut run = adopted(j)?;
            run.resume_at = j.resume_at.map(Into::into);
            Some(run)
        });
    let running = jobs
        .iter()
        .filter(unknown_live)
        .filter(|j| !unrun_prepared(j))
        .filter(|j| !j.suspended || j.release == Release::Released || j.token == max_token)
        .filter_map(adopted)
        .collect();
    Some(Behind {
        token,
        decided_through,
        running,
        prepared,
    })
}

/// A Job adopted by a status behind it, as a run.
fn adopted(j: &OwnedJob) -> Option<RunRef> {
    Some(RunRef {
        unknown: Default::default(),
        late: false,
        period: j.period?.into(),
        token: j.token?,
        job_name: j.name.clone(),
        claimed_at: None,
        job_uid: Some(j.uid.clone()),
        origin: None,
        requested_by: None,
        supersedes: None,
        replaces: Vec::new(),
        resume_at: None,
        basis: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ReplacedRun;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn job(name: &str, period: &str, token: u64) -> OwnedJob {
        OwnedJob {
            name: name.into(),
            uid: format!("uid-{name}-{token}"),
            period: Some(t(period)),
            token: Some(token),
            suspended: false,
            finished: false,
            deleting: false,
            release: Release::Released,
            resume_at: None,
        }
    }

    fn run(j: &OwnedJob) -> RunRef {
        adopted(j).expect("a job with a period and a token")
    }

    fn status(token: u64, through: &str) -> SingletonJobStatus {
        SingletonJobStatus {
            fencing_token: token,
            decided_through: Some(t(through).into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_confirmed_run_whose_job_is_still_suspended_is_resumed() {
        let mut j = job("a-1", "2030-01-01T00:00:00Z", 3);
        j.suspended = true;
        j.release = Release::NotReleased;
        let mut st = status(3, "2030-01-01T00:00:00Z");
        assert!(
            to_resume(&st, &[j.clone()], t("2030-01-01T00:00:00Z")).is_empty(),
            "not active yet"
        );
        st.active.push(run(&j));
        assert_eq!(
            to_resume(&st, &[j.clone()], t("2030-01-01T00:00:00Z")),
            vec![(j.name.clone(), j.uid.clone())]
        );
        // Released to its queue already: suspended until the queue admits it, not released again.
        let mut queued = j.clone();
        queued.release = Release::Released;
        assert!(
            to_resume(&st, &[queued], t("2030-01-01T00:00:00Z")).is_empty(),
            "released to its queue"
        );
        // Another Job of the same name (a re-creation) is not the confirmed one.
        let mut other = j.clone();
        other.uid = "someone-else".into();
        assert!(to_resume(&st, &[other], t("2030-01-01T00:00:00Z")).is_empty());
    }

    /// F2: only the controller starts a run. A Job a claim knows that runs without the
    /// controller's release was started by someone else (a webhook, a queue, a person), pending
    /// or confirmed; a released one, a suspended one and a Job of an older controller (no mark)
    /// are not.
    #[test]
    fn a_job_started_without_the_controllers_release_is_found() {
        let mut j = job("a-1", "2030-01-01T00:00:00Z", 3);
        j.release = Release::NotReleased;
        let mut st = status(3, "2030-01-01T00:00:00Z");
        st.pending_claim = Some(run(&j));
        st.pending_claim.as_mut().unwrap().job_uid = None;
        let found = started_outside(&st, std::slice::from_ref(&j));
        assert_eq!(
            found.len(),
            1,
            "a pending claim's Job started before its confirm"
        );
        assert_eq!(found[0].0.token, 3);
        st.pending_claim = None;
        st.active.push(run(&j));
        assert_eq!(
            started_outside(&st, std::slice::from_ref(&j)).len(),
            1,
            "confirmed, started by another"
        );
        let mut released = j.clone();
        released.release = Release::Released;
        assert!(started_outside(&st, &[released]).is_empty());
        let mut suspended = j.clone();
        suspended.suspended = true;
        assert!(started_outside(&st, &[suspended]).is_empty());
        let mut older = j.clone();
        older.release = Release::Unmarked;
        assert!(
            started_outside(&st, &[older]).is_empty(),
            "an older controller's Job"
        );
        let mut going = j.clone();
        going.deleting = true;
        assert!(
            started_outside(&st, &[going]).is_empty(),
            "being stopped already"
        );
    }

    /// F5: a wiped status adopts the newest claim's Job although it is still suspended (its
    /// queue has not admitted it), instead of the sweep removing it as unknown; an older
    /// suspended Job (a leftover that never ran) is not adopted.
    #[test]
    fn a_wiped_status_adopts_the_newest_suspended_job() {
        let mut newest = job("a-2", "2030-01-01T00:01:00Z", 5);
        newest.suspended = true;
        newest.release = Release::Released;
        let mut leftover = job("a-1", "2030-01-01T00:00:00Z", 4);
        leftover.suspended = true;
        leftover.release = Release::NotReleased;
        let wiped = SingletonJobStatus::default();
        let b = behind(&wiped, &[newest.clone(), leftover.clone()]).expect("behind");
        let names: Vec<&str> = b.running.iter().map(|r| r.job_name.as_str()).collect();
        assert_eq!(names, ["a-2"]);
        // The newest claim's Job even when not released yet (its confirm may have been written).
        newest.release = Release::NotReleased;
        let b = behind(&wiped, &[newest, leftover]).expect("behind");
        assert_eq!(b.running.len(), 1);
        assert_eq!(b.running[0].token, 5);
        // Nothing it adopts is unknown to the raised status.
        let mut raised = wiped.clone();
        raised.active = b.running.clone();
        raised.fencing_token = 5;
        raised.decided_through = Some(t("2030-01-01T00:01:00Z").into());
        let jobs = [job("a-2", "2030-01-01T00:01:00Z", 5)];
        let mut jobs = jobs.to_vec();
        jobs[0].uid = b.running[0].job_uid.clone().unwrap();
        assert!(unknown(&raised, &jobs).is_empty());
    }

    #[test]
    fn a_late_re_creation_of_a_decided_period_is_unknown() {
        // Period 10:00 ran with token 7, finished, and was pruned; a paused replica re-created
        // its Job (suspended, token 7) after the status moved on.
        let mut late = job("a-1000", "2030-01-01T10:00:00Z", 7);
        late.suspended = true;
        let st = status(8, "2030-01-01T10:05:00Z");
        assert_eq!(unknown(&st, std::slice::from_ref(&late)), vec![&late]);
        // The same Job while its claim is pending is the claim's own.
        let mut pending = st.clone();
        pending.pending_claim = Some(run(&late));
        pending.pending_claim.as_mut().unwrap().job_uid = None;
        assert!(unknown(&pending, std::slice::from_ref(&late)).is_empty());
        // Once confirmed, known by uid; a second object of that name is not.
        let mut active = st.clone();
        active.active.push(run(&late));
        assert!(unknown(&active, std::slice::from_ref(&late)).is_empty());
        let mut twin = late.clone();
        twin.uid = "twin".into();
        assert_eq!(unknown(&active, std::slice::from_ref(&twin)), vec![&twin]);
        // A run being replaced is known to the pending claim that replaces it.
        let mut replacing = st.clone();
        let mut claim = run(&job("a-1005", "2030-01-01T10:05:00Z", 8));
        claim.replaces.push(ReplacedRun::from(&run(&twin)));
        replacing.pending_claim = Some(claim);
        assert!(unknown(&replacing, std::slice::from_ref(&twin)).is_empty());
    }

    #[test]
    fn finished_deleting_undecided_and_newer_jobs_are_not_removed() {
        let st = status(8, "2030-01-01T10:05:00Z");
        let mut finished = job("a", "2030-01-01T10:00:00Z", 7);
        finished.finished = true;
        let mut deleting = job("b", "2030-01-01T10:00:00Z", 7);
        deleting.deleting = true;
        let undecided = job("c", "2030-01-01T10:10:00Z", 7);
        let newer = job("d", "2030-01-01T10:00:00Z", 9);
        assert!(unknown(&st, &[finished, deleting, undecided, newer]).is_empty());
        // A manual run's period is decided once its token was issued.
        let manual = job("e", "2030-01-01T10:07:00.000001Z", 8);
        assert_eq!(unknown(&st, std::slice::from_ref(&manual)).len(), 1);
    }

    #[test]
    fn a_wiped_status_is_behind_its_jobs() {
        let ran = {
            let mut j = job("a-1000", "2030-01-01T10:00:00Z", 7);
            j.finished = true;
            j
        };
        let running = job("a-1005", "2030-01-01T10:05:00Z", 8);
        let jobs = [ran, running.clone()];
        let wiped = SingletonJobStatus::default();
        let b = behind(&wiped, &jobs).expect("behind");
        assert_eq!(b.token, Some(8));
        assert_eq!(b.decided_through, Some(t("2030-01-01T10:05:00Z")));
        assert_eq!(b.running, vec![run(&running)]);
        // An etcd restore: an older status, still behind on the cursor and the token.
        let old = status(7, "2030-01-01T10:00:00Z");
        let b = behind(&old, &jobs).expect("behind");
        assert_eq!(
            (b.token, b.decided_through),
            (Some(8), Some(t("2030-01-01T10:05:00Z")))
        );
        // Up to date: nothing.
        let mut current = status(8, "2030-01-01T10:05:00Z");
        current.active.push(run(&running));
        assert_eq!(behind(&current, &jobs), None);
        // A manual period never moves the cursor.
        let manual = job("a-m", "2030-01-01T11:00:00.000001Z", 8);
        assert_eq!(behind(&current, &[manual]), None);
    }

    #[test]
    fn a_period_ran_if_any_record_says_so() {
        let p = t("2030-01-01T10:00:00Z");
        let mut st = status(8, "2030-01-01T10:05:00Z");
        assert!(!ran(&st, &[], p));
        // A Job of the period, even one the status does not know.
        assert!(ran(&st, &[job("a-1000", "2030-01-01T10:00:00Z", 7)], p));
        // The history: a run (with its Job), or a period deduplicated as having run.
        st.history.push(crate::api::HistoryEntry {
            unknown: Default::default(),
            late: false,
            period: p.into(),
            last_period: None,
            count: 1,
            outcome: crate::api::Outcome::Succeeded,
            reason: Some("BackstopSkipped".into()),
            job_name: Some("a-1000".into()),
            token: Some(7),
            start_time: None,
            finish_time: None,
            requested_by: None,
            cluster: None,
            message: None,
        });
        assert!(ran(&st, &[], p));
        st.history[0].outcome = crate::api::Outcome::Missed;
        st.history[0].job_name = None;
        assert!(!ran(&st, &[], p), "a missed period did not run");
        st.history[0].outcome = crate::api::Outcome::Deduplicated;
        assert!(ran(&st, &[], p));
    }

    /// A prepared run's Job (created ahead of its instant, not released).
    fn prepared_job(name: &str, period: &str, token: u64) -> OwnedJob {
        let mut j = job(name, period, token);
        j.suspended = true;
        j.release = Release::NotReleased;
        j.resume_at = Some(t(period));
        j
    }

    /// G4, the rollback floor: a prepared run is never resumed by the sweep, and an active run
    /// whose Job carries a `resume-at` still ahead (a status that adopted it without knowing it
    /// was prepared) waits for it; a withdrawn Job is never resumed.
    #[test]
    fn a_prepared_job_is_not_resumed_before_its_instant() {
        let j = prepared_job("a-1", "2030-01-01T00:01:00Z", 3);
        let before = t("2030-01-01T00:00:59.999Z");
        let at = t("2030-01-01T00:01:00Z");
        let mut st = status(3, "2030-01-01T00:00:00Z");
        st.prepared = Some(run(&j));
        assert!(
            to_resume(&st, std::slice::from_ref(&j), at).is_empty(),
            "prepared, not active"
        );
        st.prepared = None;
        st.active.push(run(&j));
        assert!(
            to_resume(&st, std::slice::from_ref(&j), before).is_empty(),
            "early"
        );
        assert_eq!(to_resume(&st, std::slice::from_ref(&j), at).len(), 1);
        let mut out = j.clone();
        out.release = Release::Withdrawn("Suspended".into());
        assert!(to_resume(&st, &[out], at).is_empty(), "withdrawn");
    }

    #[test]
    fn the_prepared_run_is_known_and_stopped_when_started_outside() {
        let j = prepared_job("a-1", "2030-01-01T00:01:00Z", 3);
        let mut st = status(3, "2030-01-01T00:00:00Z");
        assert_eq!(
            unknown(&st, std::slice::from_ref(&j)).len(),
            1,
            "no claim knows it"
        );
        st.prepared = Some(run(&j));
        assert!(known(&st, &j));
        assert!(unknown(&st, std::slice::from_ref(&j)).is_empty());
        assert!(started_outside(&st, std::slice::from_ref(&j)).is_empty());
        let mut started = j.clone();
        started.suspended = false;
        assert_eq!(
            started_outside(&st, std::slice::from_ref(&started)).len(),
            1
        );
        // Unsuspended after its withdrawal was marked: stopped too.
        started.release = Release::Withdrawn("Suspended".into());
        assert_eq!(started_outside(&st, &[started]).len(), 1);
    }

    /// A withdrawn Job whose deletion was lost goes, whatever its period; so does a prepared
    /// Job no claim knows whose token the status issued (a paused preparer's late create).
    #[test]
    fn withdrawn_and_orphaned_prepared_jobs_are_unknown() {
        let st = status(5, "2030-01-01T00:00:00Z");
        let mut out = prepared_job("a-2", "2030-01-01T00:02:00Z", 9);
        out.release = Release::Withdrawn("ScheduleChanged".into());
        let orphan = prepared_job("a-1", "2030-01-01T00:01:00Z", 4);
        let newer = prepared_job("a-3", "2030-01-01T00:03:00Z", 6);
        let jobs = [out.clone(), orphan.clone(), newer];
        let found = unknown(&st, &jobs);
        assert_eq!(
            found,
            vec![&out, &orphan],
            "a token above the status is news, not unknown"
        );
    }

    /// A status behind a prepared Job raises its token but decides nothing by it, and adopts it
    /// as prepared (to be judged, and withdrawn: StatusBehind), never as running.
    #[test]
    fn a_wiped_status_adopts_a_prepared_job_as_prepared() {
        let ran = {
            let mut j = job("a-0", "2030-01-01T00:00:00Z", 2);
            j.finished = true;
            j
        };
        let p = prepared_job("a-1", "2030-01-01T00:01:00Z", 3);
        let wiped = SingletonJobStatus::default();
        let b = behind(&wiped, &[ran, p.clone()]).expect("behind");
        assert_eq!(b.token, Some(3));
        assert_eq!(
            b.decided_through,
            Some(t("2030-01-01T00:00:00Z")),
            "not the prepared period"
        );
        assert!(b.running.is_empty());
        let adopted = b.prepared.expect("adopted as prepared");
        assert_eq!(adopted.job_uid.as_deref(), Some(p.uid.as_str()));
        assert_eq!(adopted.resume_at.map(|t| t.0), p.resume_at);
        assert_eq!(adopted.basis, None, "no basis: its judge withdraws it");
        // Resumed already (released): it ran, so it is a running run like any other.
        let mut resumed = p.clone();
        resumed.release = Release::Released;
        resumed.suspended = false;
        let b = behind(&wiped, &[resumed]).expect("behind");
        assert_eq!(b.prepared, None);
        assert_eq!(b.running.len(), 1);
        assert_eq!(b.decided_through, Some(t("2030-01-01T00:01:00Z")));
    }
}
