//! Prepared runs left behind by a newer release: the rollback floor of issue 33
//! (docs/design/prepared-runs.md §1, §3, §4). The controllers run with `--prepare-lead-seconds=0`,
//! as the rollback floor (0.2.0) does by default: they prepare no run themselves, but must
//! settle one they find in `status.prepared`: keep it suspended until its `resumeAt` by the API
//! server's clock and then resume it with one guarded patch and promote it to `status.active`;
//! or withdraw it (its Job marked `singleton.dev/released: withdrawn` with the reason, the
//! status cleared and its `runCount` given back, a `RunWithdrawn` Event, the Job deleted) when
//! the spec changed before the instant or the status cannot vouch for it.
//!
//! Each test crafts exactly what a preparing release writes, for the next minute boundary `p`
//! of a SingletonJob (`* * * * *`, no jitter, Forbid, no backstop) that this release's
//! controller runs: the period's Job built by the controller's own code (`job::build`),
//! suspended, `singleton.dev/released: "false"`, `singleton.dev/resume-at: <p>`, owned by the
//! SingletonJob; and the status its claim and confirm write (`fencingToken` one above,
//! `runCount` + 1, `prepared` naming the Job by uid, with `resumeAt` p and
//! `decide::prepare::basis`), with the resourceVersion read. The controller is paused
//! (SIGSTOP) across those two writes, less than a second, at least 25 s before `p`: a
//! preparing release writes its pending claim before its create, so no controller ever sees
//! its Job without a claim that knows it; unpaused, this release could see the Job first, as a
//! status behind its Jobs (test d's case), and race the status write. Test d crafts the Job
//! alone, as if the status had been wiped or restored after the preparation.
//!
//! A watch of the namespace's Jobs keeps every state each Job went through (its annotations,
//! whether it was allowed to run, the API server's time of the update that set `spec.suspend`),
//! so a Job marked and deleted within a moment is still judged, and printed on failure.
//!
//! The failpoint rows (design §4 and §6) run two replicas with leader election
//! (`e2e::STEADY_ELECTION`: a 10 s lease, an 8 s renew deadline, so that the leader keeps its
//! Lease while the suite loads the machine): replica 0 leads with one point armed
//! (`SINGLETON_FAILPOINTS=<point>=stop|abort`, the e2e build's `--features failpoints`), replica 1
//! stands by and finishes what replica 0 left: a paused old leader's late resume meeting a
//! withdrawn Job (`resume-prepared`), a withdrawal cut short after its mark (`withdraw-marked`),
//! a crash between a resume and its promote (`promote`). One more row freezes a single replica
//! at `resume-prepared` so that its late resume is certainly sent (see that test).
//!
//! Each test waits for a minute boundary: run them side by side (hack/e2e.sh passes
//! `--test-threads=8`, to tests/preparing.rs too): all eight wait for one boundary, so the binary
//! takes about 80 s.
//!
//! The harness (the controllers, the readers, the Job watch) is shared with tests/preparing.rs:
//! `e2e::prepared_runs`.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use e2e::prepared_runs::{
    JobWatch, Replicas, SJ, annotation, explained, held_back, hold_job, leader, logged,
    marked_withdrawn, never_allowed_to_run, no_pod, period_of, release_job, released_job,
    start_replicas, status, until,
};
use e2e::{Env, ensure, events_with_reason, sj_yaml};
use jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;
use singleton::api::{RunRef, SingletonJob, SingletonJobStatus};
use singleton::failpoint;
use singleton::naming::{self, ANNOTATION_RELEASED, ANNOTATION_RESUME_AT, ANNOTATION_WITHDRAWN};

/// The field manager of what this test writes as the preparing release.
const MANAGER: &str = "e2e-prepared";
/// How long before its instant the run is prepared, at least.
const LEAD: SignedDuration = SignedDuration::from_secs(25);
/// The SingletonJob: every minute, no jitter, Forbid, no backstop.
fn spec_yaml() -> String {
    sj_yaml(SJ, "* * * * *", "  concurrencyPolicy: Forbid\n")
}

// ---- The tests ----

/// G4 and G1 at the rollback floor: the prepared Job stays suspended and unreleased until its
/// instant, is unsuspended no earlier than it by the API server's clock, released with its
/// token, and promoted: `status.prepared` gone, the run active (or in the history) with its
/// token, `decidedThrough` at its period, and no second Job for the period.
#[tokio::test]
async fn a_prepared_run_is_resumed_at_its_instant_never_before() -> Result<()> {
    let s = Scene::prepare("prep-resume", true, Replicas::One).await?;
    let result = resumed_at_instant(&s).await;
    s.explained(result).await
}

async fn resumed_at_instant(s: &Scene) -> Result<()> {
    let env = &s.env;
    env.holds_for(
        "the prepared run kept until 3 s before its instant: its Job suspended, not released, \
         status.prepared naming it",
        until(s.p - SignedDuration::from_secs(3)),
        || s.still_prepared(),
    )
    .await?;
    let job = released_job(env, &s.job, &s.uid, s.token, s.p, "resumed").await?;
    // Never before its instant: the first state the watch saw it allowed to run carries the
    // API server's time (whole seconds, rounded down: a release before `p` shows `p - 1 s` at
    // the latest) of the update that unsuspended it.
    // The watch may deliver the update a moment after the read above saw it (a loaded machine).
    let first_run = env
        .wait_for(
            "the watch to see the resumed Job allowed to run",
            Duration::from_secs(15),
            || async { Ok(s.watch.states(&s.uid).into_iter().find(|x| x.ran)) },
        )
        .await?;
    let released_at = first_run.suspend_set.clone();
    println!(
        "prepared run {} (token {}) for {}: unsuspended by {:?} (API server time), \
         seen running by the watch at {}, Job startTime {:?}",
        s.job,
        s.token,
        s.p,
        released_at,
        first_run.at,
        job.status
            .as_ref()
            .and_then(|x| x.start_time.as_ref())
            .map(|t| t.0),
    );
    ensure(
        env,
        released_at.as_ref().is_some_and(|(_, at)| *at >= s.p),
        (
            "the prepared Job unsuspended no earlier than its instant, by the API server's clock",
            &released_at,
            s.p,
        ),
    )
    .await?;
    // Promoted: the period decided by this run.
    env.wait_for(
        "the run promoted: status.prepared gone, the run active or in the history with its \
         token, decidedThrough at its period",
        Duration::from_secs(30),
        || async {
            let st = status(env).await?;
            let holds = st
                .active
                .iter()
                .any(|r| r.token == s.token && r.job_uid.as_deref() == Some(s.uid.as_str()))
                || st.history.iter().any(|h| h.token == Some(s.token));
            let through = st.decided_through.as_ref().map(|t| t.0);
            Ok((st.prepared.is_none() && holds && through == Some(s.p)).then_some(()))
        },
    )
    .await?;
    env.holds_for(
        "no second Job for the period",
        Duration::from_secs(3),
        || async { Ok(s.jobs_of_p().await? == BTreeSet::from([s.uid.clone()])) },
    )
    .await?;
    s.watch
        .only_seen(env, s.p, &[&s.uid], "one Job ever seen for the period")
        .await
}

/// A suspend set before the instant withdraws the prepared run (reason Suspended): its Job
/// marked and deleted, never allowed to run, the status cleared with its `runCount` given
/// back, a `RunWithdrawn` Event; and no Job of the period exists after its instant.
#[tokio::test]
async fn a_suspend_before_the_instant_withdraws_the_prepared_run() -> Result<()> {
    let s = Scene::prepare("prep-suspend", true, Replicas::One).await?;
    let result = async {
        s.kept_a_moment().await?;
        s.suspend().await?;
        s.withdrawn("Suspended", false, s.p).await?;
        s.never_runs().await
    }
    .await;
    s.explained(result).await
}

/// A schedule edit before the instant withdraws the prepared run (reason ScheduleChanged),
/// and its period never runs.
#[tokio::test]
async fn a_schedule_edit_withdraws_the_prepared_run() -> Result<()> {
    let s = Scene::prepare("prep-edit", true, Replicas::One).await?;
    let result = async {
        s.kept_a_moment().await?;
        let edit = json!({ "spec": { "schedule": "0 0 1 1 *" } });
        s.env
            .sjs()
            .patch(SJ, &PatchParams::default(), &Patch::Merge(&edit))
            .await?;
        s.withdrawn("ScheduleChanged", false, s.p).await?;
        s.never_runs().await
    }
    .await;
    s.explained(result).await
}

/// The prepared Job without the status that names it (the status wiped or restored after the
/// preparation): never resumed, withdrawn (StatusBehind) and deleted without ever running;
/// the period is then decided as the schedule says: it runs at its instant, in a Job of its
/// own with a higher token.
#[tokio::test]
async fn a_status_without_the_prepared_run_adopts_and_withdraws_its_job() -> Result<()> {
    let s = Scene::prepare("prep-behind", false, Replicas::One).await?;
    let result = async {
        s.withdrawn("StatusBehind", true, s.p).await?;
        // The adoption counts the run as its preparation did; the withdrawal gives it back.
        let st = status(&s.env).await?;
        anyhow::ensure!(
            st.run_count == s.before.run_count,
            "runCount {} before the Job was crafted, {} after its withdrawal (fencingToken {})",
            s.before.run_count,
            st.run_count,
            st.fencing_token
        );
        s.runs_later().await
    }
    .await;
    s.explained(result).await
}

// ---- Failpoints: replica 0 paused or crashed at a point, replica 1 takes over ----

/// Design §4, "a paused old leader's late resume is refused": replica 0 freezes at the instant,
/// after its gate check and right before sending the prepared run's resume (`resume-prepared`,
/// SIGSTOP), and stays frozen past its Lease. Meanwhile `suspend: true` is set and replica 1,
/// leading once that Lease ran out, withdraws the run: its Job marked withdrawn (W1, reason
/// Suspended), the status cleared, the Job deleted (W5). This test holds the Job with a
/// finalizer of its own, so that the late resume still finds it, as it would a Job whose
/// delete was lost or slow (otherwise the resume of a Job gone is refused for want of one, and
/// the `released` test is never reached). Then replica 0 is let go: its resume is sent late,
/// to the same uid, still suspended, and only its `released == "false"` test refuses it; unless
/// its election loop, finding the renew deadline passed, aborts it first, unsent (a race,
/// mostly won by the send: see [`start_replicas`]; the next row has none). From the watch:
/// the Job was never unsuspended nor released; no pod ran for the period; `status.prepared` is
/// gone; replica 0 exits (it lost its Lease).
#[tokio::test]
async fn a_late_resume_of_a_withdrawn_run_is_refused() -> Result<()> {
    let two = Replicas::Two {
        point: failpoint::RESUME_PREPARED,
        action: "stop",
    };
    let s = Scene::prepare("prep-late", true, two).await?;
    let result = late_resume_refused(&s).await;
    // Whatever became of the test: a finalizer left behind would keep the namespace forever.
    let let_go = s.release_hold().await;
    s.explained(result.and(let_go)).await
}

async fn late_resume_refused(s: &Scene) -> Result<()> {
    let env = &s.env;
    env.wait_for(
        "replica 0 frozen at the instant, right before sending the resume (resume-prepared)",
        until(s.p) + Duration::from_secs(20),
        || async { Ok(env.controller_stopped(0).then_some(())) },
    )
    .await?;
    // Both before replica 1 leads (replica 0's Lease runs 10 s from its last renewal): a new
    // leader finding the instant passed and nothing changed resumes the run itself.
    s.hold_job().await?;
    s.suspend().await?;
    let lead = leader(env).await?;
    ensure(
        env,
        lead == Some(0),
        (
            "the Job held and the SingletonJob suspended while the Lease still named replica 0",
            lead,
        ),
    )
    .await?;
    env.wait_for("replica 1 to lead", Duration::from_secs(30), || async {
        Ok((leader(env).await? == Some(1)).then_some(()))
    })
    .await?;
    env.wait_for(
        "replica 1's withdrawal: the Job marked withdrawn and deleted (held by this test's \
         finalizer), status.prepared gone",
        Duration::from_secs(30),
        || async {
            let states = s.watch.states(&s.uid);
            let marked = states.iter().any(|x| x.withdrawn.is_some());
            let deleting = states.iter().any(|x| x.deleting);
            let st = status(env).await?;
            Ok((marked && deleting && st.prepared.is_none()).then_some(()))
        },
    )
    .await?;
    // What the late resume meets: the same uid, still suspended, marked withdrawn.
    let job = env.jobs().get_opt(&s.job).await?;
    let seen = job.as_ref().map(|j| {
        (
            j.uid(),
            j.spec.as_ref().and_then(|x| x.suspend),
            annotation(j, ANNOTATION_RELEASED).map(String::from),
        )
    });
    let expected = (
        Some(s.uid.clone()),
        Some(true),
        Some(naming::WITHDRAWN.to_string()),
    );
    ensure(
        env,
        seen.as_ref() == Some(&expected),
        (
            "the withdrawn Job still there for the late resume: uid, suspend, released",
            &seen,
        ),
    )
    .await?;
    // Replica 0 goes on from where it froze: its resume is sent now, late.
    env.signal_controller(0, "CONT").await?;
    env.wait_for(
        "replica 0 to exit (it lost its Lease)",
        Duration::from_secs(30),
        || async { Ok(env.controller_exited(0).then_some(())) },
    )
    .await?;
    let continued = logged(
        env,
        0,
        &["failpoint: continued", failpoint::RESUME_PREPARED],
    );
    let lost = logged(env, 0, &["lost leadership"]);
    ensure(
        env,
        continued && lost,
        (
            "replica 0 went on from the point, then exited for its lost Lease",
            ("continued", continued),
            ("lost leadership", lost),
        ),
    )
    .await?;
    s.never_unsuspended().await?;
    s.release_hold().await?;
    let by = Timestamp::now() + SignedDuration::from_secs(30);
    s.withdrawn("Suspended", false, by).await?;
    s.never_runs().await
}

/// The same refusal, without chance (design §3.3, W1: "the resume's `released == "false"` test
/// can never pass again, whoever sends it, however late"). In the row above, replica 0's late
/// resume is sent only if it gets out before its election loop, continued, finds the renew
/// deadline passed and aborts the reconciles in flight: the request is then dropped unsent,
/// and the `released` test is not reached. Here one replica, without election (its gate stays
/// open, as a leader's is until its renew deadline), freezes at the instant right before
/// sending the resume (`resume-prepared`); meanwhile this test does what a replica withdrawing
/// the run does: `suspend: true`, and W1 with the very patch `kube_io::withdraw_job` sends (the
/// Job marked withdrawn, reason Suspended). Continued, the replica certainly sends its resume,
/// to the same uid, still suspended, marked withdrawn: only its `released` test refuses it.
/// Then it finds the mark and finishes the withdrawal (W2 on): the Job never unsuspended nor
/// released, deleted, no pod; status.prepared gone, `runCount` given back, one `RunWithdrawn`
/// Event.
#[tokio::test]
async fn a_resume_sent_after_the_withdrawal_mark_is_refused() -> Result<()> {
    let one = Replicas::OneArmed {
        point: failpoint::RESUME_PREPARED,
        action: "stop",
    };
    let s = Scene::prepare("prep-mark", true, one).await?;
    let result = async {
        let env = &s.env;
        env.wait_for(
            "the controller frozen at the instant, right before sending the resume \
             (resume-prepared)",
            until(s.p) + Duration::from_secs(20),
            || async { Ok(env.controller_stopped(0).then_some(())) },
        )
        .await?;
        s.suspend().await?;
        s.mark_withdrawn("Suspended").await?;
        env.signal_controller(0, "CONT").await?;
        s.never_unsuspended().await?;
        let continued = logged(
            env,
            0,
            &["failpoint: continued", failpoint::RESUME_PREPARED],
        );
        ensure(
            env,
            continued,
            "the controller went on from the point (its resume sent, late)",
        )
        .await?;
        let by = Timestamp::now() + SignedDuration::from_secs(30);
        s.withdrawn("Suspended", false, by).await?;
        s.never_runs().await
    }
    .await;
    s.explained(result).await
}

/// Design §3.3, "the next judge continues from where a dead replica stopped (mark seen → W2
/// on)": replica 0 withdraws the run (`suspend: true` before its instant) and crashes right
/// after marking its Job withdrawn (W1, `withdraw-marked`: abort), before anything else;
/// replica 1, leading once replica 0's Lease ran out, finds the mark and finishes W2 to W5:
/// status.prepared gone, `runCount` given back, the Job deleted, one `RunWithdrawn` Event (the
/// crashed replica published none), and the Job never ran.
#[tokio::test]
async fn a_withdrawal_cut_short_after_its_mark_is_finished_by_the_next_leader() -> Result<()> {
    let two = Replicas::Two {
        point: failpoint::WITHDRAW_MARKED,
        action: "abort",
    };
    let s = Scene::prepare("prep-cut", true, two).await?;
    let result = async {
        let env = &s.env;
        s.kept_a_moment().await?;
        s.suspend().await?;
        env.wait_for(
            "replica 0 to crash right after marking the Job withdrawn (withdraw-marked)",
            Duration::from_secs(20),
            || async { Ok(env.controller_exited(0).then_some(())) },
        )
        .await?;
        // Cut short: the Job marked, the status not yet cleared (replica 1 leads 10 s later at
        // the earliest).
        let job = env.jobs().get_opt(&s.job).await?;
        let mark = job
            .as_ref()
            .and_then(|j| annotation(j, ANNOTATION_RELEASED).map(String::from));
        let st = status(env).await?;
        let still = st.prepared.as_ref().map(|r| r.token);
        let aborted = logged(env, 0, &["failpoint: aborting", failpoint::WITHDRAW_MARKED]);
        ensure(
            env,
            aborted && mark.as_deref() == Some(naming::WITHDRAWN) && still == Some(s.token),
            (
                "replica 0 aborted after W1: the Job marked withdrawn, status.prepared still set",
                ("aborted at the point", aborted),
                ("released", &mark),
                ("status.prepared's token", still),
            ),
        )
        .await?;
        env.wait_for("replica 1 to lead", Duration::from_secs(30), || async {
            Ok((leader(env).await? == Some(1)).then_some(()))
        })
        .await?;
        s.withdrawn("Suspended", false, s.p).await?;
        let note = format!("prepared run {} (token {})", s.job, s.token);
        let by_1 = logged(env, 1, &[&note, "withdrawn"]);
        let by_0 = logged(env, 0, &[&note, "withdrawn"]);
        ensure(
            env,
            by_1 && !by_0,
            (
                "the withdrawal recorded by replica 1, not by replica 0",
                ("replica 1", by_1),
                ("replica 0", by_0),
            ),
        )
        .await?;
        s.never_runs().await
    }
    .await;
    s.explained(result).await
}

/// Design §4, "Job `Released` (the old leader resumed it) → promote": replica 0 resumes the
/// prepared run at its instant and crashes before the promote's status write (`promote`:
/// abort); replica 1, leading once replica 0's Lease ran out, finds the Job released with the
/// run's token and promotes it: status.prepared gone, the run active (or in the history) with
/// its token, `decidedThrough` at its period, exactly one Job for the period, unsuspended no
/// earlier than its instant.
#[tokio::test]
async fn a_crash_before_the_promote_is_finished_by_the_next_leader() -> Result<()> {
    let two = Replicas::Two {
        point: failpoint::PROMOTE,
        action: "abort",
    };
    let s = Scene::prepare("prep-promote", true, two).await?;
    let result = async {
        let env = &s.env;
        resumed_at_instant(&s).await?;
        let aborted = logged(env, 0, &["failpoint: aborting", failpoint::PROMOTE]);
        let done = "prepared run resumed at its instant";
        let by_1 = logged(env, 1, &[done]);
        let by_0 = logged(env, 0, &[done]);
        ensure(
            env,
            env.controller_exited(0) && aborted && by_1 && !by_0,
            (
                "replica 0 crashed after its resume, before its promote; replica 1 promoted",
                ("replica 0 aborted at the point", aborted),
                ("promoted by replica 1", by_1),
                ("promoted by replica 0", by_0),
            ),
        )
        .await
    }
    .await;
    s.explained(result).await
}

// ---- The prepared run, crafted ----

/// One test's world: its namespace and controllers, the watch of its Jobs, and the prepared
/// run.
struct Scene {
    env: Env,
    /// How many controllers it started (`e2e-0` ...).
    replicas: usize,
    watch: JobWatch,
    /// The prepared period, a minute boundary: its `resumeAt` too (no jitter).
    p: Timestamp,
    token: u64,
    /// The prepared Job's name and uid.
    job: String,
    uid: String,
    /// The status right before the preparation.
    before: SingletonJobStatus,
    /// Whether the status naming the prepared run was written (else only its Job).
    with_status: bool,
}

/// What a preparation wrote.
struct Crafted {
    p: Timestamp,
    token: u64,
    job: String,
    uid: String,
    before: SingletonJobStatus,
}

impl Scene {
    /// A namespace, its controllers and the SingletonJob; once the status is settled with the
    /// next minute boundary `p` at least [`LEAD`] away, `p`'s run prepared: its Job and, when
    /// `with_status`, the status naming it. With [`Replicas::Two`], replica 0 leads (the one
    /// paused across the two writes: replica 1 stands by, and writes nothing).
    async fn prepare(name: &str, with_status: bool, replicas: Replicas) -> Result<Scene> {
        let mut env = Env::new(name).await?;
        // The rollback floor as released (0.2.0's default): it settles a run a later release
        // prepared, and prepares none itself, so the one prepared run is the crafted one (with
        // the lead on, its own preparations met the armed failpoints first).
        let count = start_replicas(&mut env, replicas, &["--prepare-lead-seconds=0"]).await?;
        let watch = JobWatch::start(env.client.clone(), &env.ns, Some(MANAGER)).await?;
        env.create_sj(&spec_yaml()).await?;
        for _ in 0..3 {
            env.wait_for(
                "a settled status (no run active, pending or prepared; nextScheduleTime the \
                 next minute boundary, at least 25 s away)",
                Duration::from_secs(100),
                || async { Ok(ready(&env.get_sj(SJ).await?, Timestamp::now())) },
            )
            .await?;
            // Paused across the two writes (see the module's comment), resumed whatever
            // became of them.
            if with_status {
                env.signal_controller(0, "STOP").await?;
            }
            let crafted = craft(&env, with_status).await;
            if with_status {
                env.signal_controller(0, "CONT").await?;
            }
            if let Some(c) = crafted? {
                if count > 1 {
                    // The pause (under a second) is shorter than the renew deadline (8 s).
                    let lead = leader(&env).await?;
                    ensure(
                        &env,
                        lead == Some(0) && !env.controller_exited(0),
                        ("replica 0 still leads after the preparation", lead),
                    )
                    .await?;
                }
                println!(
                    "{}: prepared {} (token {}, uid {}) for {}, {} status",
                    env.ns,
                    c.job,
                    c.token,
                    c.uid,
                    c.p,
                    if with_status { "with its" } else { "without a" }
                );
                return Ok(Scene {
                    env,
                    replicas: count,
                    watch,
                    p: c.p,
                    token: c.token,
                    job: c.job,
                    uid: c.uid,
                    before: c.before,
                    with_status,
                });
            }
        }
        let dump = env.dump().await;
        Err(anyhow!(
            "no preparation written in three tries (the controller wrote the status each time \
             in between)\n{dump}"
        ))
    }

    /// Whether the run is still prepared: its Job suspended and not released (nor withdrawn),
    /// and `status.prepared` naming it.
    async fn still_prepared(&self) -> Result<bool> {
        let Some(job) = self.env.jobs().get_opt(&self.job).await? else {
            return Ok(false);
        };
        let st = status(&self.env).await?;
        Ok(held_back(&job, &self.uid)
            && st
                .prepared
                .as_ref()
                .is_some_and(|r| r.token == self.token && r.job_name == self.job))
    }

    /// Sets `spec.suspend: true` (a user's edit).
    async fn suspend(&self) -> Result<()> {
        let edit = json!({ "spec": { "suspend": true } });
        self.env
            .sjs()
            .patch(SJ, &PatchParams::default(), &Patch::Merge(&edit))
            .await?;
        Ok(())
    }

    /// W1 as a withdrawing replica writes it (`kube_io::withdraw_job`'s patch): the prepared
    /// Job, if still that uid and not released, marked withdrawn with `reason`.
    async fn mark_withdrawn(&self, reason: &str) -> Result<()> {
        let ptr = |k: &str| format!("/metadata/annotations/{}", k.replace('/', "~1"));
        let ops: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/uid", "value": self.uid},
            {"op": "test", "path": ptr(ANNOTATION_RELEASED), "value": naming::NOT_RELEASED},
            {"op": "replace", "path": ptr(ANNOTATION_RELEASED), "value": naming::WITHDRAWN},
            {"op": "add", "path": ptr(ANNOTATION_WITHDRAWN), "value": reason},
        ]))?;
        let pp = PatchParams {
            field_manager: Some(MANAGER.into()),
            ..PatchParams::default()
        };
        self.env
            .jobs()
            .patch(&self.job, &pp, &Patch::Json::<()>(ops))
            .await?;
        Ok(())
    }

    /// From the watch, over 2 s (a late request's time to land): no state of the prepared Job
    /// unsuspended or released with the run's token.
    async fn never_unsuspended(&self) -> Result<()> {
        let token = self.token.to_string();
        self.env
            .holds_for(
                "the withdrawn Job never unsuspended nor released with the run's token (every \
                 state the watch saw)",
                Duration::from_secs(2),
                || async {
                    Ok(self.watch.states(&self.uid).iter().all(|x| {
                        x.suspend == Some(true) && x.released.as_deref() != Some(token.as_str())
                    }))
                },
            )
            .await
    }

    /// Holds the prepared Job (the finalizer [`e2e::prepared_runs::HOLD`]): deleted, it stays until
    /// [`Scene::release_hold`].
    async fn hold_job(&self) -> Result<()> {
        hold_job(&self.env, &self.job, &self.uid, MANAGER).await
    }

    /// Lets the prepared Job go (no finalizer); nothing to do when it is gone.
    async fn release_hold(&self) -> Result<()> {
        release_job(&self.env, &self.job, &self.uid, MANAGER).await
    }

    /// The controller keeps the prepared run for a moment (it is not withdrawn on sight).
    async fn kept_a_moment(&self) -> Result<()> {
        self.env
            .holds_for(
                "the prepared run kept (before any edit)",
                Duration::from_secs(2),
                || self.still_prepared(),
            )
            .await
    }

    /// The prepared run withdrawn for `reason` before `by` (its instant, unless a test withdraws
    /// it later on purpose): its Job marked (always with that reason) and deleted, never allowed
    /// to run, `status.prepared` gone, a `RunWithdrawn` Event (a Warning when `warning`); with
    /// the status crafted, `runCount` back to its value before the preparation.
    async fn withdrawn(&self, reason: &str, warning: bool, by: Timestamp) -> Result<()> {
        let env = &self.env;
        let what = format!(
            "the prepared run withdrawn ({reason}): its Job marked and deleted, status.prepared \
             gone, a RunWithdrawn Event"
        );
        let events = env
            .wait_for(&what, until(by), || async {
                let states = self.watch.states(&self.uid);
                let marked = states.iter().any(|x| x.withdrawn.is_some());
                let gone = states.iter().any(|x| x.deleted);
                let st = status(env).await?;
                let evs = events_with_reason(env, "RunWithdrawn").await?;
                Ok((marked && gone && st.prepared.is_none() && !evs.is_empty()).then_some(evs))
            })
            .await?;
        let states = self.watch.states(&self.uid);
        marked_withdrawn(env, &states, reason).await?;
        let marked_at = states.iter().find(|x| x.withdrawn.is_some()).map(|x| x.at);
        ensure(
            env,
            marked_at.is_some_and(|t| t < by),
            (
                "marked withdrawn before",
                by,
                marked_at,
                ("the instant", self.p),
            ),
        )
        .await?;
        never_allowed_to_run(env, &states).await?;
        no_pod(env, &self.uid).await?;
        let kind = if warning { "Warning" } else { "Normal" };
        let named: Vec<_> = events
            .iter()
            .filter(|e| {
                e.message
                    .as_deref()
                    .is_some_and(|m| m.contains(&self.job) && m.contains(&self.token.to_string()))
            })
            .map(|e| (e.type_.clone(), e.message.clone()))
            .collect();
        ensure(
            env,
            named.len() == 1 && named[0].0.as_deref() == Some(kind),
            (
                "one RunWithdrawn Event naming the run, of type",
                kind,
                &named,
            ),
        )
        .await?;
        let st = status(env).await?;
        if self.with_status {
            ensure(
                env,
                st.run_count == self.before.run_count,
                (
                    "runCount given back: before the preparation, after the withdrawal",
                    self.before.run_count,
                    st.run_count,
                ),
            )
            .await?;
        }
        Ok(())
    }

    /// After its instant, no Job of the prepared period exists, nor was ever seen but the
    /// withdrawn one.
    async fn never_runs(&self) -> Result<()> {
        self.env
            .holds_for(
                "no Job of the withdrawn period, until 5 s after its instant",
                until(self.p + SignedDuration::from_secs(5)),
                || async { Ok(self.jobs_of_p().await?.is_empty()) },
            )
            .await?;
        self.watch
            .only_seen(
                &self.env,
                self.p,
                &[&self.uid],
                "no Job of the period seen but the withdrawn one",
            )
            .await
    }

    /// After the withdrawal, the period is decided as without preparation: at its instant (never
    /// before, by the API server's clock) it runs in a Job of its own with a higher token.
    async fn runs_later(&self) -> Result<()> {
        let env = &self.env;
        let (uid, token) = env
            .wait_for(
                "the period run by this release's own claim, in a new Job with a higher token",
                until(self.p) + Duration::from_secs(30),
                || async {
                    let jobs = env.job_list().await?;
                    Ok(jobs.iter().find_map(|j| {
                        let token = e2e::token_of(j);
                        let ours = period_of(j) == Some(self.p)
                            && token > self.token
                            && annotation(j, ANNOTATION_RELEASED)
                                == Some(token.to_string().as_str());
                        ours.then(|| (j.uid().unwrap_or_default(), token))
                    }))
                },
            )
            .await?;
        // The watch may deliver the update a moment after the read above saw it.
        let released_at = env
            .wait_for(
                "the watch to see the period's new Job allowed to run",
                Duration::from_secs(15),
                || async { Ok(self.watch.states(&uid).into_iter().find(|x| x.ran)) },
            )
            .await?
            .suspend_set;
        println!(
            "{}: the period ran as token {token}, unsuspended by {released_at:?}",
            env.ns
        );
        ensure(
            env,
            released_at.as_ref().is_some_and(|(_, at)| *at >= self.p),
            (
                "the period's own run unsuspended no earlier than its instant",
                &released_at,
            ),
        )
        .await?;
        self.watch
            .only_seen(
                env,
                self.p,
                &[&self.uid, &uid],
                "the withdrawn Job and the run's, no other, for the period",
            )
            .await
    }

    /// The uids of the Jobs of the prepared period that exist now.
    async fn jobs_of_p(&self) -> Result<BTreeSet<String>> {
        Ok(self
            .env
            .job_list()
            .await?
            .iter()
            .filter(|j| period_of(j) == Some(self.p))
            .filter_map(|j| j.uid())
            .collect())
    }

    /// `result`, with what a failure needs besides [`Env`]'s dump: every state of every Job
    /// the watch saw (annotations included) and the controller's log lines about prepared runs.
    async fn explained(&self, result: Result<()>) -> Result<()> {
        let run = format!(
            "---- prepared: {} (token {}, uid {}) for {}, status before: runCount {} \
             fencingToken {}\n",
            self.job,
            self.token,
            self.uid,
            self.p,
            self.before.run_count,
            self.before.fencing_token,
        );
        let about = ["prepared", "withdr", "error", "warn"];
        explained(result, &self.env, self.replicas, &self.watch, &about, &run)
    }
}

/// The next minute boundary, if `sj`'s status is settled for a preparation of it at `now`: no
/// run active, pending or prepared, its spec observed, the boundary its next period and at
/// least [`LEAD`] away.
fn ready(sj: &SingletonJob, now: Timestamp) -> Option<Timestamp> {
    let st = sj.status.as_ref()?;
    let p = Timestamp::from_second(now.as_second().div_euclid(60) * 60 + 60).ok()?;
    let next = st
        .next_schedule_time
        .as_deref()
        .and_then(|t| t.parse::<Timestamp>().ok());
    let settled = st.active.is_empty()
        && st.pending_claim.is_none()
        && st.prepared.is_none()
        && st.observed_generation == sj.metadata.generation;
    (settled && next == Some(p) && p.duration_since(now) >= LEAD).then_some(p)
}

/// Writes what a preparing release writes for the next period (see the module's comment);
/// None when the status moved meanwhile (nothing is left behind then).
async fn craft(env: &Env, with_status: bool) -> Result<Option<Crafted>> {
    let sj = env.get_sj(SJ).await?;
    let Some(p) = ready(&sj, Timestamp::now()) else {
        return Ok(None);
    };
    let before = sj.status.clone().unwrap_or_default();
    let token = before.fencing_token + 1;
    let schedule = singleton::decide::schedule(&sj.spec, &HashMap::new())
        .map_err(|e| anyhow!("the SingletonJob's schedule: {e:?}"))?
        .with_shift_floor(before.shifts_after.as_ref().map(|t| t.0));
    let mut job = singleton::job::build(&sj, p, token, &schedule.window(p))
        .map_err(|e| anyhow!("building the period's Job: {e:?}"))?;
    let name = job.name_any();
    anyhow::ensure!(
        name == naming::job_name(SJ, p),
        "job::build named the Job {name}, not naming::job_name's {}",
        naming::job_name(SJ, p)
    );
    job.spec.get_or_insert_with(Default::default).suspend = Some(true);
    job.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_RESUME_AT.into(), naming::period_rfc3339(p));
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..PostParams::default()
    };
    let created = env.jobs().create(&pp, &job).await?;
    let uid = created.uid().context("the created Job has no uid")?;
    if with_status {
        let mut st = before.clone();
        st.fencing_token = token;
        st.run_count += 1;
        st.prepared = Some(RunRef {
            unknown: Default::default(),
            late: false,
            period: p.into(),
            token,
            job_name: name.clone(),
            claimed_at: Some(Timestamp::now().into()),
            job_uid: Some(uid.clone()),
            origin: None,
            requested_by: None,
            supersedes: None,
            replaces: Vec::new(),
            resume_at: Some(p.into()),
            basis: Some(singleton::decide::prepare::basis(&sj.spec, &schedule)),
        });
        let mut obj = sj.clone();
        obj.status = Some(st);
        match env.sjs().replace_status(SJ, &pp, &obj).await {
            Ok(_) => {}
            // Written meanwhile (the resourceVersion read is a precondition): this preparation
            // never happened, and its Job goes.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..DeleteParams::background()
                };
                env.jobs().delete(&name, &dp).await?;
                env.wait_job_gone("a preparation's Job whose status write lost", &name)
                    .await?;
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(Crafted {
        p,
        token,
        job: name,
        uid,
        before,
    }))
}
