//! An explicit-state model check of the run protocol (src/run.rs), explored exhaustively.
//!
//! # The world
//!
//! The API server's SingletonJob (its status, with a resourceVersion), its Job store (every Job
//! ever created, in creation order: a Job's uid is its index there; a Job is suspended, resumed
//! by the controller, or unsuspended by someone else, live or deleted, finished or not; a live
//! Job holds its period's deterministic name, a deleted one frees it), the backstop (claim rows
//! UNIQUE(period), the fence, the highest retired token and the newest registered attempt), a
//! clock that makes [`PERIODS`] periods fall due, and [`ACTORS`] controller replicas. Status
//! records per period Running(token) once a run is confirmed, Done(token) once its outcome is
//! recorded (finished, Job gone, or Replaced), Failed(token) once a Job someone else started
//! was stopped, Missed, Deduplicated or ForeignJob; `active` and a claim's `replaces` are sets
//! of Job uids.
//!
//! With [`Config::pods`], the pods of the Jobs that run (issue 31): each is one attempt of its
//! run, at most [`MAX_PODS`] per Job, with its phase as Kubernetes sees it (running,
//! terminating, terminal) and whether its process still runs (it may, while terminating and,
//! on a partitioned node, after a force delete). The controller's resume marks the Job
//! `released`; a Job unsuspended by anyone else has no mark (observable).
//!
//! # The protocol (each numbered step is one atomic transition of one actor)
//!
//! 1. Read status (and the Jobs) and decide (catchUp Latest). First, a Job the status's claims
//!    know (the pending claim's period and token, or a uid in `active`) that runs without the
//!    `released` mark is stopped (StartedBeforeConfirm): its token retired in the backstop, then
//!    a CAS on the read resourceVersion clearing the claim that knew it and deciding its period
//!    Failed, then, once that write succeeded, the Job deleted by uid (three steps, in that
//!    order; a 409 ends the stop with the Job left running, fenced out). Else a pending claim is
//!    completed (on to 4). Else a run in `active` whose Job is still suspended is resumed (on to
//!    9: a confirm whose resume was lost). Else runs whose Job finished or is gone are recorded
//!    as Done, their tokens retired in the backstop first (a step of its own, before the status
//!    write), and the newest due period is claimed (Forbid waits while a run is active; Replace
//!    replaces the active runs) or the records are written alone.
//! 2. Token = max(status token, fence) + 1.
//! 3. Claim: compare-and-swap (CAS) on the read resourceVersion writing `pending`, the token and
//!    the decided cursor. 409: back to idle.
//! 4. Backstop: insert the claim row and advance the fence to the token, in one transaction. Our
//!    own row: go on, unless its token is retired (a stop of the claim's Job retired it and did
//!    not get to write its decision): then record the period Failed (CAS) without a Job. Another
//!    token's row: record Deduplicated (CAS). No row but a fence at or above the token (stale):
//!    re-claim the same period with max(status, fence) + 1 (a CAS of its own), then 4 again.
//! 5. Re-read: go on only while `pending` is exactly this claim.
//! 6. Replace: delete the Jobs of `pending.replaces`, by uid.
//! 7. Create the Job suspended. Its name taken by a live Job: same token, adopt it, or stop it as
//!    in step 1 if someone else started it (`create::name_taken`); another token, delete it (by
//!    uid, a step of its own, then create again) if it is suspended and step 5's status knows it
//!    not (neither the pending claim's period and token nor a uid in `active`), else record
//!    ForeignJob (CAS). A Job that comes back from create not suspended (a mutating webhook
//!    cleared `suspend`) is stopped as in step 1 (JobNotSuspended): token retired, period decided
//!    Failed by a CAS on step 5's resourceVersion, then the Job deleted.
//! 8. Confirm: CAS on step 5's resourceVersion moving the claim to `active` with the Job's uid (and
//!    the replaced runs out, as Done). 409: re-read; this uid in `active` goes on to 9, else the
//!    Job (which never ran) is deleted by uid.
//! 9. Resume the Job by uid, a patch that tests uid and `suspend == true` and sets `suspend:
//!    false` and the `released` mark at once: a deleted uid is a 404, a resumed one stays as it
//!    is, one someone else unsuspended fails the test and is left to the stop.
//!
//! The sweeper is a round of its own, in the controller's order: read status, then list the Jobs
//! (the reconcile gets its SingletonJob, then looks at the Job cache), then delete (by uid) a
//! listed Job the controller did not release (suspended, or unsuspended by someone else), not
//! finished, that status does not know and whose token is not above the status's (a newer
//! claim's Job, created after the read, is not unknown); or stop, as in step 1, a listed Job
//! that the status read knows and someone else unsuspended (its write CAS on that read's
//! resourceVersion).
//!
//! Only the leader begins a round (step 1, or the sweeper's); a round begun goes on whoever
//! leads now: a leader paused past its lease (or a request stalled in a TCP buffer) resumes with
//! its stale reads and resourceVersions. An actor pauses between any two steps for as long as
//! any interleaving needs, and may crash at any step, losing its local state.
//!
//! The environment: leadership moves; a period falls due; a resumed Job finishes; a finished Job
//! that `active` does not reference is deleted (history pruning with a limit of 0, or a user)
//! where the configuration prunes. With the backstop, once, the fence rises above every token
//! without a status write ([`Config::bump`]: break-lock's fence step), which is what makes a
//! claim's token stale at step 4, and once an earlier incarnation's claim row appears
//! ([`Config::foreign_row`]), which is what a period is Deduplicated against. Without it, once a
//! foreign Job (token 0: an earlier incarnation's, a user's) appears under a period's name,
//! suspended or running ([`Config::foreign`]), which is what step 7's other-token branches meet.
//! With [`Config::external`], once, someone other than the controller (a person, a GitOps tool,
//! a queue) unsuspends any live suspended Job, or step 7's create comes back not suspended.
//!
//! With pods, the Job controller, the kubelet and the workload ([`pod_steps`]) replace "a
//! resumed Job finishes". The Job controller creates a pod for a live, unfinished Job that was
//! unsuspended (by anyone) when none of its pods is active by [`Replacement`]: `Failed` (what
//! the controller sets) counts running and terminating pods, `TerminatingOrFailed`
//! (Kubernetes' default) only running ones; with its pods used up and none active, the Job
//! fails (backoff limit). A running pod is deleted or evicted (terminating, its process runs
//! on), fails, or succeeds (its Job finishes). A terminating pod ends (its grace period over:
//! terminal, its process gone) or, with [`Pods::partition`], is force-deleted (or removed by
//! PodGC) while its process runs on a partitioned node: terminal to Kubernetes, not to the
//! database. A deleted Job's running pods are terminating. With [`Workload::Attempts`] a pod
//! whose process runs registers once (`<p>attempt(job, token, attempt)`): it becomes the
//! backstop's newest attempt. A registration and each fenced transaction serialise on the fence
//! row's lock, so each is one atomic step.
//!
//! Without pods, every Job that was ever resumed may make one fenced write at any later time,
//! also after it finished or was deleted (a zombie pod). With pods, every pod whose process
//! runs may (also a terminating one, and one force-deleted on a partition), and nothing else.
//! No transition is needed for a write: it changes nothing in the world (a run's token is never
//! above the fence, which the G5 invariant checks), so the invariants ask in every state whether
//! the fence would accept it: `singleton_fence(t)` (t >= fence and t > retired), and with pods
//! per [`Workload`]: `<p>fence(job, token, attempt)` also asks that the pod be the newest
//! registered attempt of its token, `<p>fence(job, token)` that no attempt of the token
//! registered (none does in that workload).
//!
//! # Invariants (checked in every state; a violation comes with a shortest trace to it)
//!
//! [`Inv`]: G1 over Job uids (at most one Job of a period was ever resumed by the controller; a
//! suspended Job created and deleted never ran); a token's Job is resumed at most once, and
//! never once its token's outcome was recorded, nor once the backstop retired it (G3: no Job
//! carrying a retired token is started again, [`Inv::ResumedRetired`]); G3 (tokens of the Jobs
//! that ran increase in creation order; over every Job created it does not hold,
//! [`Cov::CreatedOutOfOrder`]);
//! fencing, over every Job that ran, also one someone else started (a write is refused once a
//! Job with a newer token exists, and once its own run's outcome was recorded: the equal-token
//! case); G5 (never two runs at once, under Forbid and, because the old Job is deleted before
//! the new one is resumed, under Replace; the fence reaches a run's token before it runs); G2
//! (with no claim pending every decided period has a run or an outcome; no confirmed run is
//! deleted by the controller before it ran; at quiescence every period is decided and no
//! confirmed run is left suspended).
//!
//! With pods, G1 within a run (attempts are ordered by when they began: their registration
//! with [`Workload::Attempts`], their creation with [`Workload::TokenOnly`]): no attempt's write
//! is accepted once an attempt of its token began after it ([`Inv::AttemptsOverlap`]), and no
//! two attempts of a token could both have a write accepted at once
//! ([`Inv::TwoAttemptsWrite`]). With the attempt fence both hold for either replacement policy,
//! also with a force delete on a partition. With the token-only fence they hold only with
//! `Failed` and no partition; `TerminatingOrFailed` (a replacement beside a terminating pod
//! whose process runs) and `Failed` with a force delete on a partition (Kubernetes sees the old
//! pod terminal, its process runs on) let two attempts of one run write: F1, the reason the
//! attempt fence exists, shown by `token_only_fence_lets_two_attempts_write`.
//!
//! With external resumers, only the controller starts a run, as far as the design can have it: a
//! Job someone else unsuspends may run pods and have writes accepted before the controller sees it,
//! and after (its stop retires its token in a later step than the read that found it); from the
//! retirement on, nothing of it is accepted, and nothing once its period is decided (the fencing
//! invariants above, over it too). What is guaranteed: fenced writes of no two Jobs of one period
//! are accepted, at any two moments ([`Inv::ExternallyStarted`]); such a Job, once confirmed, is
//! never recorded as the period's run while it is still there ([`Inv::ExternalAdopted`]: it is
//! stopped, its period Failed); and no Job is resumed with a token a stop retired
//! ([`Inv::ResumedRetired`]). Every stop retires, records (CAS), then deletes, so the period's name
//! stays taken by the stopped Job until its claim is decided: a replica completing the claim
//! meanwhile finds that Job (step 7 stops it too) or, past the retirement, its own row retired
//! (step 4 decides the period Failed), and a confirm read before the decision loses to it. A stop
//! cut short after its retirement (a crash, a 409, lost leadership) leaves the claim pending and
//! the Job running, fenced out, until one of these decides it. Each other order is caught: deleting
//! first lets the completion's Job write beside the stopped one ([`Broken::DeleteBeforeRetire`]);
//! retiring, deleting, then recording (the sweep's order before) lets a completer that passed step
//! 4 before the retirement create, confirm and resume a new Job with the retired token
//! ([`Broken::DeleteBeforeRecord`], caught by [`Inv::ResumedRetired`] only: none of that Job's
//! writes passes the fence). Without the retirement, the stopped Job's writes are accepted after
//! its period is decided ([`Broken::StopWithoutRetire`], [`Inv::FenceRetired`]; with the record
//! before the delete it no longer lets a second Job of the period write).
//!
//! What the design does not prevent (`a_pending_claims_job_deleted_by_someone_else_is_run_again`,
//! the model's pruning of finished Jobs standing for a user): a pending claim's Job that someone
//! else started and that someone other than the controller's stop deletes before the claim is
//! decided leaves nothing in Kubernetes to stop, and the claim's completion creates, confirms
//! and resumes the period's Job again with the same token. With no retirement before, both
//! Jobs' writes are accepted ([`Inv::ExternallyStarted`]); past a stop's retirement cut short
//! before its record, the new Job runs with the retired token ([`Inv::ResumedRetired`]).
//!
//! # Prepared runs (issue 33, docs/design/prepared-runs.md; [`prepared`])
//!
//! With [`Config::prepare`], once in an execution the environment PREPAREs the next period's run
//! ahead of its instant, when nothing is pending or active (P1) and every due period is decided:
//! its claim row inserted and the fence advanced to a new token (with the backstop), its Job
//! created suspended with `released: "false"` (and `resume-at`: it is a prepared Job), and one
//! status write naming its uid in `status.prepared`, the token its, the cursor not moved. Once,
//! while a run is prepared, a user EDITs the SingletonJob (a generation bump, the resourceVersion
//! moves) so that the prepared period is not to be run at its instant. A period's instant is the
//! moment it falls due. Step 1 settles a prepared run before anything but a pending claim, by the
//! judge (`decide::prepare::judge`) on what it read: first, the Job gone once its instant has
//! come: PROMOTE (it may have been resumed, and run), whatever changed since; the Job resumed:
//! PROMOTE; marked withdrawn: the withdrawal from W2 on; the token not the status's, the period
//! decided, or the edit: the withdrawal (from W2 on if the Job is gone); the Job gone (before
//! the instant: it never ran): the withdrawal from W2 on; before the instant: nothing (Keep);
//! after it, if a newer period is due (catchUp Latest would start that one): the withdrawal;
//! else RESUME-PREPARED:
//!
//! - R: one patch testing uid, `suspend == true` and `released == "false"`, setting the release
//!   (a failed test or a 404: re-read the Job, step R', then promote if it was resumed, go on
//!   with the withdrawal from W2 if it is marked withdrawn, else stop);
//! - P: PROMOTE, a CAS on the judge's resourceVersion moving it from `prepared` to `active`,
//!   recording it Running and deciding its period (a run counts from its resume).
//!
//! WITHDRAW, each step atomic (an actor may pause or crash between any two): W1 the Job marked
//! `released: withdrawn` by a patch testing uid and `released == "false"` (a failed test: W1',
//! re-read the Job: resumed, promote instead; marked, go on; a 404, or the re-read finding the Job
//! gone: go on before the instant; once it has come the Job may have been resumed by another
//! replica and run, so the withdrawal stops there, back to idle, and the next judge decides: it
//! promotes); W2+W3 one backstop transaction archiving the claim row of (period, token), so that
//! the period may be claimed again (UNIQUE(period) counts only live rows), and retiring the token;
//! W4 a CAS on the judge's resourceVersion clearing `prepared` (cursor unmoved); W5 the Job deleted
//! by uid. The ordinary protocol then decides the period as without preparation: claimed again with
//! a new token when it is the newest due, Missed when a newer one is. The sweeper knows the
//! prepared run (by uid) and removes a withdrawn Job whose W5 was lost (`observe::unknown`).
//! Break-lock's fence rise ([`Config::bump`]) marks the prepared Job withdrawn first (its step 1b).
//!
//! Invariants: [`Inv::ReleasedEarly`] (a prepared Job resumed before its instant),
//! [`Inv::WithdrawnRan`] (a Job marked withdrawn resumed), [`Inv::LostToPreparation`] (at
//! quiescence a period that was prepared neither ran nor was recorded, or was recorded
//! Deduplicated with no run); G1, G3, fencing, G5 and G2 as without preparation. Broken variants:
//! [`Broken::NoReleasedTest`], [`Broken::PreparedInActive`], [`Broken::WithdrawRecordFirst`],
//! [`Broken::RetireBeforeMark`], and [`Broken::WithdrawGoneJob`]: the gap this model found with
//! Jobs deleted by someone else (the pruning), now fixed in `src/` as above (a prepared Job
//! resumed, its promote lost, finished and deleted, then withdrawn by a judge that asked about
//! the edit before the missing Job, or by a withdrawal whose W1 got a 404, and its period run
//! again), with each half of it alone ([`Broken::JudgeGoneJobLate`],
//! [`Broken::MarkGoneGoesOn`]).
//!
//! Simplified: PREPARE is one step (steps 3 to 7 of a preparation are the protocol's own, checked
//! above; a preparer paused between them is not modelled, nor its late create that
//! `observe::unknown` removes), at most one run is prepared and one edit made in an execution,
//! the edit only while a run is prepared; what the plan decides for the period after a
//! withdrawal is modelled as catchUp Latest with the period still to run (a template edit; a
//! suspension's Skipped is the plan's, not modelled); the freshness check, the clock's bounds
//! and the resume queue are not modelled (reads are fresh, a paused actor's read is stale; the
//! instant is the model's clock, so "may have passed" by the clock's upper bound, which
//! `run::prepared` asks of a missing Job, and "has come" by its lower bound, which the judge
//! asks, are one; an invalid schedule, whose verdict `run::prepared` gives before that question,
//! is not modelled); `runCount`/`maxRuns`, the backstop's attempt check at W2+W3
//! (`not_started`: no pods with prepared runs) and an unavailable backstop (the deferred
//! `unsettledClaims`) are left out; break-lock's step 1b and its fence rise are one step, and
//! its status write is not modelled (as before); `observe::to_resume`'s resume-at bound is not
//! modelled (a prepared run is never in `active` before its resume; [`Broken::PreparedInActive`]
//! takes out both lines). No pods, external resumers or earlier incarnation's claim row.
//!
//! # Bounds
//!
//! Two periods and two actors, every interleaving of them: crashes, pauses and leadership
//! changes are unbounded. Two periods are the fewest with an older run to replace or to prune
//! whose period a stale actor could run again, and a period to record as Missed; two actors are
//! the fewest with a stale actor racing a current one. Steps are atomic and an actor keeps what
//! it read, so the second actor can be in any stage with any resourceVersion it once read, and a
//! crashed actor's claim is completed by the next reader; a third actor only adds stale actors
//! side by side. Set [`ACTORS`] to 3 to check that: every configuration without pods holds, in
//! 36 million states and nine minutes of a debug build (at most 7 Jobs), against 0.7 million
//! states and seconds with two. The fence rises at most once and one foreign row or Job appears
//! at most once. Jobs are bounded by what the protocol creates (at most [`MAX_JOBS`], asserted;
//! 5 are reached, 6 with prepared runs). The visited set holds each state in a canonical form
//! ([`canon`]): resourceVersions as current or stale, actors in order.
//!
//! Pods: two per Job, the fewest with a replacement beside an older pod. Nothing of a Job whose
//! token is fenced out (below the fence, or retired; both only rise) can pass the fence again,
//! and the controller does not look at pods, so in the canonical form such a Job keeps no pods
//! (it may still finish) and the newest attempt is dropped when it is one of its; the attempts'
//! order is numbered without gaps, and a deleted Job's finished flag is dropped. External
//! resumers: one external start (either kind) in an execution; two were checked once (1.7 and
//! 2.7 million states under Forbid and Replace, no partition: every invariant holds, at most 6
//! Jobs). Configurations with pods leave out the earlier incarnation's claim row and the pruning
//! of finished Jobs, and those with external resumers also the fence's rise by itself (see
//! [`pods`]). With pruning, external resumers and the attempt fence, every invariant but
//! [`Inv::ExternallyStarted`] and [`Inv::ResumedRetired`] was checked once to hold (Forbid,
//! 5.9 million states); those two fail, as the test of the gap above shows.
//!
//! Prepared runs: one preparation and one edit in an execution, Forbid and Replace, with and
//! without the backstop, finished Jobs pruned: 0.42 to 1.21 million states a configuration,
//! 3.05 million in all (at most 6 Jobs). Without pruning (0.16 to 0.38 million) every state is
//! one of these: pruning only adds transitions.
//!
//! The broken variants ([`Broken`]) show that the checker is not vacuous: each one is caught,
//! with a shortest trace, and each invariant catches at least one of them.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::time::{Duration, Instant};

/// Periods in the model.
const PERIODS: u8 = 2;
/// Controller replicas.
const ACTORS: usize = 2;
/// Jobs ever created, asserted: the protocol creates no more within the bounds.
const MAX_JOBS: usize = 8;
/// The actors' names in traces (one more, "C", with three actors).
const NAMES: [&str; ACTORS] = ["A", "B"];
/// Pods (attempts) per Job, with pods modelled: the Job's backoff limit in the model.
const MAX_PODS: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    Forbid,
    Replace,
}

/// Deliberately broken protocols, to show the checker is not vacuous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broken {
    None,
    /// Today's protocol before the resume step: the Job is created running, there is no step 9
    /// (a lost confirm still deletes a Job that the winning status does not know).
    OldProtocol,
    /// The backstop never retires a token: `singleton_fence` accepts t >= fence.
    NoRetirement,
    /// The outcome is written to status first and the token retired after, in a step of its
    /// own that a crash can lose.
    RetireAfterRecord,
    /// A lost confirm (409) resumes its Job anyway.
    ResumeOnLostConfirm,
    /// Status writes without the resourceVersion precondition (a blind PUT).
    BlindStatusWrite,
    /// The Job is created (suspended) before the status claim is written.
    CreateBeforeClaim,
    /// The backstop inserts the claim row without advancing the fence.
    RowWithoutFence,
    /// Replace deletes the old Jobs after the new one is resumed, not before it is created.
    ReplaceAfterResume,
    /// catchUp Latest moves the cursor over older due periods without recording them Missed.
    SilentMiss,
    /// Step 1 never resumes a confirmed run whose resume was lost.
    NoResumeRepair,
    /// The sweeper deletes suspended Jobs that `active` does not know, ignoring the pending
    /// claim.
    SweepIgnoresPending,
    /// The sweeper deletes a suspended Job no claim of its status knows even when the Job's token
    /// is above the status's (it read status before listing the Jobs, as the controller does, so
    /// a newer claim's Job can be in the list: only the token bound tells it apart).
    SweepUnbounded,
    /// `<p>fence(job, token, attempt)` accepts any registered attempt of the token, not only the
    /// newest.
    NoAttemptCheck,
    /// The controller neither looks at a Job's `released` mark nor at what create returns: a Job
    /// someone else unsuspended is confirmed, recorded and left running like its own.
    IgnoreExternalResume,
    /// A Job started outside the controller is deleted and its period decided Failed, but its
    /// token is not retired.
    StopWithoutRetire,
    /// A Job that comes back from create not suspended is deleted first, its token retired
    /// after (then its period decided Failed).
    DeleteBeforeRetire,
    /// Every stop of a Job started outside the controller retires its token, deletes the Job,
    /// then records the decision (the sweep's order before the fix): the Job is gone while the
    /// claim that knew it may still be pending.
    DeleteBeforeRecord,
    /// The prepared run's resume does not test `released == "false"` (only uid and `suspend`): a
    /// resume sent after another replica's W1 marked the Job withdrawn passes.
    NoReleasedTest,
    /// The prepared run is kept in `active` (not `status.prepared`): step 1's repair of a lost
    /// resume (`observe::to_resume`, without its resume-at bound) resumes it at once.
    PreparedInActive,
    /// The withdrawal records (W4: `prepared` cleared) before it archives the backstop claim and
    /// retires the token (W2+W3): a claim of the period meanwhile meets the live row.
    WithdrawRecordFirst,
    /// The withdrawal archives the claim and retires the token (W2+W3) before it marks the Job
    /// withdrawn (W1): a resume sent before the mark still passes, with a retired token.
    RetireBeforeMark,
    /// The order before the fix: the judge asks P2, the cursor and the basis before whether a
    /// missing Job may have run (a Job gone after its instant, edited meanwhile, is withdrawn),
    /// and a withdrawal whose W1 gets a 404, or whose re-read finds the Job gone, goes on to W2
    /// also past the instant. A resumed Job whose promote was lost, then gone, is withdrawn and
    /// its period run again.
    WithdrawGoneJob,
    /// [`Broken::WithdrawGoneJob`]'s judge alone (the withdrawal stops as fixed).
    JudgeGoneJobLate,
    /// [`Broken::WithdrawGoneJob`]'s withdrawal alone (the judge promotes as fixed).
    MarkGoneGoesOn,
}

/// When the Job controller creates a replacement pod: the Job's `podReplacementPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replacement {
    /// Only once the previous pod is terminal: what the controller sets on every Job.
    Failed,
    /// As soon as the previous pod is terminating (deleted, evicted): Kubernetes' default.
    TerminatingOrFailed,
}

/// What the workload's fenced transactions call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    /// Registers each attempt once at its start (`<p>attempt(job, token, attempt)`) and fences
    /// with `<p>fence(job, token, attempt)`: the billing example.
    Attempts,
    /// Never registers; fences with `<p>fence(job, token)` (token-level only).
    TokenOnly,
}

/// The pods of the Jobs that run, and the workload in them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pods {
    replacement: Replacement,
    workload: Workload,
    /// A terminating pod may be force-deleted (or removed by PodGC) while its process still runs
    /// on a partitioned node: Kubernetes sees it terminal, the process writes on.
    partition: bool,
}

#[derive(Clone, Copy, Debug)]
struct Config {
    policy: Policy,
    backstop: bool,
    /// Finished Jobs that `active` no longer references may be deleted (history pruning with a
    /// limit of 0, or a user). Replace deletes Jobs itself regardless.
    prune: bool,
    /// The fence may rise once without a status write (break-lock, another incarnation).
    bump: bool,
    /// A foreign Job (token 0: an earlier incarnation's, a user's) may appear once, suspended or
    /// running, under a period's name.
    foreign: bool,
    /// With the backstop: an earlier incarnation's claim row (token 0) for a period may appear
    /// once.
    foreign_row: bool,
    /// The pods of the Jobs that run (attempts), the Job's replacement policy and the workload's
    /// fence. None: a Job that ran may write at any later time (one zombie pod, token-level).
    pods: Option<Pods>,
    /// With pods: once, someone other than the controller unsuspends a suspended Job (a person,
    /// a GitOps tool, a queue), or a mutating webhook makes a Job come back from create not
    /// suspended.
    external: bool,
    /// Prepared runs (issue 33): once, a period's run is prepared ahead of its instant, and a
    /// user's edit may come while it is (see [`prepared`]).
    prepare: bool,
    broken: Broken,
}

/// The invariants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inv {
    /// G1 over Job uids: at most one Job of a period was ever resumed.
    G1,
    /// A token's Job is resumed at most once (a re-created Job with that token never runs).
    TokenRanTwice,
    /// No Job is resumed after its token was retired (its outcome recorded).
    RetiredRan,
    /// G3: tokens of the Jobs that ran strictly increase in creation order.
    G3,
    /// Fencing: a write is refused once a Job with a newer token was created.
    FenceOlder,
    /// Fencing, the equal-token case: a write is refused once its run's outcome was recorded.
    FenceRetired,
    /// G5: never two resumed, unfinished, live Jobs (Forbid; Replace deletes the old one first).
    G5Two,
    /// G5: with the backstop the fence has reached a Job's token before it is resumed.
    G5Fence,
    /// G2: with no claim pending, every decided period has a run or a recorded outcome.
    G2Decided,
    /// G2: no confirmed run's Job is deleted by the controller before it ran (except Replace).
    G2Lost,
    /// G2 at quiescence: every period decided and no confirmed run left suspended.
    G2Quiet,
    /// G1 within a run: a write of an attempt is accepted although an attempt of the same token
    /// began after it (registered, with [`Workload::Attempts`]; was created, with
    /// [`Workload::TokenOnly`]).
    AttemptsOverlap,
    /// G1 within a run: two attempts (pods whose process runs) of one token could both have a
    /// write accepted now: not "at most one attempt at a time".
    TwoAttemptsWrite,
    /// Only the controller starts a run: fenced writes of two different Jobs of one period were
    /// accepted (at any two moments).
    ExternallyStarted,
    /// Only the controller starts a run: the status records as done the run of a confirmed Job
    /// that someone else unsuspended while that Job is still there (it was adopted as the
    /// period's run instead of being stopped: deleted, its period decided Failed).
    ExternalAdopted,
    /// G3 (no Job carrying a retired token is started again): the controller resumed a Job
    /// whose token the backstop had retired (a stop retired it, the claim was completed anyway).
    ResumedRetired,
    /// G4 with preparation: a prepared run's Job was resumed before its instant (its period
    /// fell due).
    ReleasedEarly,
    /// G1 with preparation: a Job marked withdrawn (W1) was resumed.
    WithdrawnRan,
    /// G2 with preparation: at quiescence a prepared period neither ran nor was recorded, or was
    /// recorded Deduplicated with no run of it.
    LostToPreparation,
}

impl Inv {
    const ALL: [Inv; 19] = [
        Inv::G1,
        Inv::TokenRanTwice,
        Inv::RetiredRan,
        Inv::G3,
        Inv::FenceOlder,
        Inv::FenceRetired,
        Inv::G5Two,
        Inv::G5Fence,
        Inv::G2Decided,
        Inv::G2Lost,
        Inv::G2Quiet,
        Inv::AttemptsOverlap,
        Inv::TwoAttemptsWrite,
        Inv::ExternallyStarted,
        Inv::ExternalAdopted,
        Inv::ResumedRetired,
        Inv::ReleasedEarly,
        Inv::WithdrawnRan,
        Inv::LostToPreparation,
    ];

    fn bit(self) -> u32 {
        1 << self as u32
    }

    fn text(self) -> &'static str {
        match self {
            Inv::G1 => "G1: two Jobs of one period ran",
            Inv::TokenRanTwice => "G3: two Jobs with one token ran",
            Inv::RetiredRan => "G3: a Job ran with a retired token",
            Inv::G3 => "G3: tokens of Jobs that ran do not increase in creation order",
            Inv::FenceOlder => {
                "fencing: an older token's write accepted after a newer Job was created"
            }
            Inv::FenceRetired => "fencing: a retired token's write accepted (equal-token case)",
            Inv::G5Two => "G5: two runs active at once",
            Inv::G5Fence => "G5: a Job ran before the fence reached its token",
            Inv::G2Decided => "G2: a decided period has neither a run nor a recorded outcome",
            Inv::G2Lost => "G2: a confirmed run's Job was deleted before it ran",
            Inv::G2Quiet => "G2: quiescent with a period undecided or a confirmed run not resumed",
            Inv::AttemptsOverlap => {
                "G1: an attempt's write accepted after a newer attempt of its run began"
            }
            Inv::TwoAttemptsWrite => "G1: two attempts of one run could both write at once",
            Inv::ExternallyStarted => "G1: writes of two Jobs of one period were accepted",
            Inv::ExternalAdopted => "G1: a Job someone else started recorded as the period's run",
            Inv::ResumedRetired => "G3: the controller resumed a Job whose token was retired",
            Inv::ReleasedEarly => "G4: a prepared run's Job was resumed before its instant",
            Inv::WithdrawnRan => "G1: a Job marked withdrawn was resumed",
            Inv::LostToPreparation => {
                "G2: a prepared period neither ran nor was recorded (or Deduplicated, no run)"
            }
        }
    }
}

/// Paths of the protocol the exploration went through (to show the model reaches them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cov {
    /// A Job was created with the period and token of an earlier, deleted Job (the window).
    Recreated,
    /// Step 7 adopted a live Job with the claim's token.
    Adopted,
    /// Step 7 deleted a suspended Job nobody knew, to create its own.
    ForeignDeleted,
    /// Step 7 recorded ForeignJob.
    ForeignRecorded,
    /// Step 4 found another token's row and recorded Deduplicated.
    Deduplicated,
    /// Step 4 found its token stale and re-claimed.
    Reclaimed,
    /// Step 5 found the claim no longer pending.
    RecheckFailed,
    /// A lost confirm found its uid in the winner's `active` and resumed.
    LostConfirmResumed,
    /// A lost confirm deleted its Job.
    LostConfirmDeleted,
    /// A resume found its Job deleted (404).
    ResumeNotFound,
    /// Step 1 resumed a confirmed run whose resume was lost.
    ResumeRepaired,
    /// The sweeper deleted a suspended Job.
    Swept,
    /// A token was retired.
    Retired,
    /// Some run's write would be refused by the fence.
    StaleRefused,
    /// A Job was created with a token not above every earlier Job's: G3 holds over the Jobs
    /// that ran, not over every Job created.
    CreatedOutOfOrder,
    /// A pod was created while an earlier pod of its Job was terminating, its process running.
    ReplacedWhileTerminating,
    /// A pod's process runs although Kubernetes sees it terminal (force delete on a partition).
    ZombiePod,
    /// Two pods of one Job ran at once.
    TwoPodsAlive,
    /// An attempt registered while an older attempt of its run still ran.
    AttemptSuperseded,
    /// A Job someone else unsuspended was stopped (retired, decided Failed, deleted).
    ExternalStopped,
    /// A Job came back from create not suspended and was stopped.
    NotSuspendedAtCreate,
    /// A resume found its Job unsuspended by someone else (the patch's test failed).
    ResumeFoundStarted,
    /// Some fenced write of a Job someone else started was accepted.
    ExternalWrote,
    /// Step 4 found its own claim row with a retired token (a stop retired it and did not get to
    /// write its decision) and decided the period Failed without a Job.
    RetiredClaimDecided,
    /// Step 7 found the claim's own Job (its token) started by someone else and stopped it.
    OwnJobStopped,
    /// A prepared run's Job was resumed at its instant (the patch's tests passed).
    PreparedResumed,
    /// A withdrawal's record (W4) was written: `status.prepared` cleared, the cursor unmoved.
    PreparedWithdrawn,
    /// A Job was created for a period whose prepared run was withdrawn (claimed again, a new
    /// token, its archived claim row no longer counting).
    PreparedPeriodAgain,
    /// A prepared resume's `released == "false"` test failed: the Job was marked withdrawn.
    ResumeFoundWithdrawn,
    /// A withdrawal's W1 test failed on a resumed Job: promoted instead.
    MarkFoundResumed,
    /// The sweeper removed a Job marked withdrawn (its W5 was lost).
    WithdrawnSwept,
    /// Break-lock's step 1b marked the prepared run's Job withdrawn.
    LockBrokeMarked,
    /// A prepared run whose Job was gone was promoted (after its instant: it may have run).
    GonePromoted,
    /// A withdrawal's W1 got a 404, or its re-read found the Job gone, past the instant: it
    /// stopped (the next judge promotes).
    WithdrawalFoundGone,
}

impl Cov {
    const ALL: [Cov; 34] = [
        Cov::Recreated,
        Cov::Adopted,
        Cov::ForeignDeleted,
        Cov::ForeignRecorded,
        Cov::Deduplicated,
        Cov::Reclaimed,
        Cov::RecheckFailed,
        Cov::LostConfirmResumed,
        Cov::LostConfirmDeleted,
        Cov::ResumeNotFound,
        Cov::ResumeRepaired,
        Cov::Swept,
        Cov::Retired,
        Cov::StaleRefused,
        Cov::CreatedOutOfOrder,
        Cov::ReplacedWhileTerminating,
        Cov::ZombiePod,
        Cov::TwoPodsAlive,
        Cov::AttemptSuperseded,
        Cov::ExternalStopped,
        Cov::NotSuspendedAtCreate,
        Cov::ResumeFoundStarted,
        Cov::ExternalWrote,
        Cov::RetiredClaimDecided,
        Cov::OwnJobStopped,
        Cov::PreparedResumed,
        Cov::PreparedWithdrawn,
        Cov::PreparedPeriodAgain,
        Cov::ResumeFoundWithdrawn,
        Cov::MarkFoundResumed,
        Cov::WithdrawnSwept,
        Cov::LockBrokeMarked,
        Cov::GonePromoted,
        Cov::WithdrawalFoundGone,
    ];

    fn bit(self) -> u64 {
        1 << self as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Claim {
    period: u8,
    token: u8,
    /// Uids of the runs to replace (Replace).
    replaces: u16,
}

/// What status records for a period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Rec {
    None,
    Running(u8),
    Done(u8),
    Missed,
    Deduplicated,
    ForeignJob,
    /// Its Job was started by someone else and stopped (StartedBeforeConfirm, JobNotSuspended).
    Failed(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Status {
    token: u8,
    /// Periods < decided are decided (status.decidedThrough as a count).
    decided: u8,
    pending: Option<Claim>,
    /// Uids of the active runs.
    active: u16,
    /// `status.prepared`: the uid of the prepared run's Job (its period and token are the Job's).
    prepared: Option<u8>,
    recorded: [Rec; PERIODS as usize],
}

/// A pod's phase as Kubernetes sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
enum Phase {
    #[default]
    Running,
    /// Deleted or evicted (a deletionTimestamp): its process may run on, for its grace period or
    /// for as long as its node is partitioned.
    Terminating,
    /// Failed, succeeded, or gone (grace period over, force-deleted, PodGC).
    Terminal,
}

/// A pod of a Job: one attempt of its run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Pod {
    phase: Phase,
    /// Its process runs, so it may still register and write: while running, while terminating,
    /// and when force-deleted on a partitioned node.
    alive: bool,
    /// When it began, in order (1, 2, ...; 0: not yet): with [`Workload::Attempts`] its
    /// registration (the database's order), with [`Workload::TokenOnly`] its creation.
    begun: u8,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Job {
    period: u8,
    token: u8,
    /// Exists in the API server (a deleted Job frees its name).
    live: bool,
    /// Was resumed (ran): stays true after it finished or was deleted.
    resumed: bool,
    finished: bool,
    /// Ghost: a confirm named this uid.
    confirmed: bool,
    /// Ghost: deleted as a replaced run (Replace).
    replaced: bool,
    /// Unsuspended by someone other than the controller: it runs without the `released` mark
    /// (observable). `resumed` is only ever the controller's resume.
    external: bool,
    /// Ghost (with external resumers): one of its pods began, so a fenced write of it was
    /// accepted (or could have been: at that moment the fence accepted its token, and it was
    /// the newest attempt). Kept when its pods are dropped (its token fenced out).
    wrote: bool,
    /// Its pods (attempts), in creation order.
    pods: [Pod; MAX_PODS],
    npods: u8,
    /// A prepared run's Job: created ahead of its period's instant (`singleton.dev/resume-at`,
    /// observable), and ghost: it was ever `status.prepared`.
    prepared: bool,
    /// Marked `released: withdrawn` (W1, or break-lock's step 1b): no resume may pass.
    withdrawn: bool,
}

impl Job {
    /// Unsuspended, by the controller or by someone else: the Job controller runs its pods.
    fn started(&self) -> bool {
        self.resumed || self.external
    }

    /// Still suspended, as the API server shows it.
    fn suspended(&self) -> bool {
        !self.started()
    }
}

/// An actor's program counter and local state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Pc {
    Idle,
    /// Step 2 (after retiring the tokens in `retire`, a step of its own).
    Token {
        rv: u16,
        next: Status,
        period: u8,
        replaces: u16,
        retire: u16,
        /// Broken::RetireAfterRecord: retired after the status write.
        late: u16,
    },
    /// Step 3.
    Claim {
        rv: u16,
        next: Status,
        claim: Claim,
        late: u16,
        /// Broken::CreateBeforeClaim: whether the Job was already created.
        created: bool,
    },
    /// Step 4; `base` is the status this actor knows (resourceVersion `rv`).
    Backstop {
        rv: u16,
        base: Status,
        claim: Claim,
        late: u16,
    },
    /// Step 4's re-claim write, with the new token.
    Reclaim {
        rv: u16,
        base: Status,
        claim: Claim,
    },
    /// Step 5.
    Recheck {
        claim: Claim,
    },
    /// Step 6; `base` and `rv` are step 5's.
    Replace {
        rv: u16,
        base: Status,
        claim: Claim,
    },
    /// Step 7.
    Create {
        rv: u16,
        base: Status,
        claim: Claim,
    },
    /// Step 7's delete of a suspended Job nobody knows, before creating again.
    DeleteForeign {
        rv: u16,
        base: Status,
        claim: Claim,
        uid: u8,
    },
    /// Step 8.
    Confirm {
        rv: u16,
        base: Status,
        claim: Claim,
        uid: u8,
    },
    /// Step 8 lost (409): next is the re-read.
    Lost {
        claim: Claim,
        uid: u8,
    },
    /// Step 8 lost and the winner does not know the Job: delete it.
    DeleteOwn {
        uid: u8,
    },
    /// Step 9 (`replaces`: Broken::ReplaceAfterResume deletes them after).
    Resume {
        uid: u8,
        replaces: u16,
    },
    /// Broken::ReplaceAfterResume.
    LateReplace {
        replaces: u16,
    },
    /// The sweeper read this status (at `rv`, kept only with external resumers: a stop writes
    /// status): next is listing the Jobs.
    SweepRead {
        status: Status,
        rv: u16,
    },
    /// A Job someone else unsuspended, that `next`'s claims know: retire its token (unless
    /// `retired`), then write `next` (its period Failed, the claim that knew it gone) at `rv`,
    /// then ([`Pc::StopDelete`]) delete it by uid. Broken::DeleteBeforeRecord deletes it before
    /// the write.
    Stop {
        rv: u16,
        next: Status,
        uid: u8,
        retired: bool,
    },
    /// A stop's decision is written: delete its Job by uid.
    StopDelete {
        uid: u8,
    },
    /// Broken::DeleteBeforeRetire: step 7's Job came back from create not suspended: delete it
    /// by uid, then retire its token and write `next` (its period Failed) at `rv`.
    NotSuspended {
        rv: u16,
        next: Status,
        uid: u8,
    },
    /// The sweeper's delete.
    Sweep {
        uid: u8,
    },
    /// A status write without a claim (records; Deduplicated; ForeignJob).
    Write {
        rv: u16,
        next: Status,
        retire: u16,
        late: u16,
    },
    /// Broken::RetireAfterRecord: the retirement after the write.
    Retire {
        retire: u16,
    },
    /// RESUME-PREPARED: the one patch at the instant, testing uid, `suspend == true` and
    /// `released == "false"`; `base` and `rv` are the judge's read.
    ResumePrepared {
        rv: u16,
        base: Status,
        uid: u8,
    },
    /// The prepared resume's tests failed, or its Job is gone: read the Job's mark.
    ResumeReread {
        rv: u16,
        base: Status,
        uid: u8,
    },
    /// PROMOTE: a CAS on `rv` moving the prepared run to `active`, deciding its period.
    Promote {
        rv: u16,
        base: Status,
        uid: u8,
    },
    /// WITHDRAW: W1 to W5 ([`prepared::WStep`]), each a step; `marked`: W1 is done (the Job is
    /// marked withdrawn, or gone).
    Withdraw {
        rv: u16,
        base: Status,
        uid: u8,
        step: prepared::WStep,
        marked: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    due: u8,
    leader: u8,
    rv: u16,
    status: Status,
    jobs: [Job; MAX_JOBS],
    njobs: u8,
    /// The backstop's claim rows: the token per period.
    rows: [Option<u8>; PERIODS as usize],
    fence: u8,
    retired: u8,
    bumped: bool,
    foreign: bool,
    /// The backstop's newest registered attempt (`attempt`, `attempt_token` of the fence row):
    /// 0 none, else [`attempt_id`] of the pod; it counts only while its token is the fence's.
    newest: u8,
    /// An external resume (or a webhook's create) happened: at most once.
    external: bool,
    /// Ghost: tokens (bits) whose run's outcome a status write recorded.
    done: u32,
    /// Ghost: invariants (bits of [`Inv`]) a transition broke, seen only at that moment.
    bad: u32,
    /// A run was prepared (at most once).
    prepped: bool,
    /// The user's edit since the prepared run's preparation (its basis no longer the spec's).
    edited: bool,
    actors: [Pc; ACTORS],
}

// The visited set's hashing is most of the run time: only the Jobs created are hashed (the
// others are all default), each packed into one word. Equal states hash alike (the derived
// `Eq` compares every field); a field left out would only cost collisions.
impl Hash for State {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let flags = [
            self.bumped,
            self.foreign,
            self.external,
            self.prepped,
            self.edited,
        ];
        let flags = flags.iter().fold(0, |w, &f| w << 1 | u8::from(f));
        h.write_u64(u64::from_le_bytes([
            self.due,
            self.leader,
            self.njobs,
            self.fence,
            self.retired,
            self.newest,
            flags,
            0,
        ]));
        h.write_u16(self.rv);
        self.status.hash(h);
        for job in self.jobs() {
            h.write_u64(job.word());
        }
        self.rows.hash(h);
        h.write_u64(u64::from(self.done) << 32 | u64::from(self.bad));
        self.actors.hash(h);
    }
}

impl Job {
    /// Every field in one word, for [`State`]'s hash.
    fn word(&self) -> u64 {
        let flags = [
            self.live,
            self.resumed,
            self.finished,
            self.confirmed,
            self.replaced,
            self.external,
            self.wrote,
            self.prepared,
            self.withdrawn,
        ];
        let mut w = flags.iter().fold(0, |w, &f| w << 1 | u64::from(f));
        w = w << 8 | u64::from(self.period);
        w = w << 8 | u64::from(self.token);
        w = w << 8 | u64::from(self.npods);
        for p in &self.pods {
            w = w << 11 | (p.phase as u64) << 9 | u64::from(p.alive) << 8 | u64::from(p.begun);
        }
        w
    }
}

fn initial() -> State {
    State {
        due: 0,
        leader: 0,
        rv: 1,
        status: Status {
            token: 0,
            decided: 0,
            pending: None,
            active: 0,
            prepared: None,
            recorded: [Rec::None; PERIODS as usize],
        },
        jobs: [Job::default(); MAX_JOBS],
        njobs: 0,
        rows: [None; PERIODS as usize],
        fence: 0,
        retired: 0,
        bumped: false,
        foreign: false,
        newest: 0,
        external: false,
        done: 0,
        bad: 0,
        prepped: false,
        edited: false,
        actors: [Pc::Idle; ACTORS],
    }
}

fn bit(uid: usize) -> u16 {
    1 << uid
}

/// The backstop's name of pod `i` of Job `uid` (its pod uid, `SINGLETON_ATTEMPT`).
fn attempt_id(uid: usize, i: usize) -> u8 {
    (uid * MAX_PODS + i + 1) as u8
}

fn uids(mask: u16) -> impl Iterator<Item = usize> {
    (0..MAX_JOBS).filter(move |&u| mask & bit(u) != 0)
}

impl State {
    fn jobs(&self) -> &[Job] {
        &self.jobs[..self.njobs as usize]
    }

    fn live_job(&self, period: u8) -> Option<usize> {
        self.jobs()
            .iter()
            .position(|j| j.live && j.period == period)
    }

    /// Whether `status` knows Job `uid`: the pending claim's period and token, in `active`, or
    /// the prepared run (by uid).
    fn known(&self, status: &Status, uid: usize) -> bool {
        let j = self.jobs[uid];
        status
            .pending
            .is_some_and(|c| c.period == j.period && c.token == j.token)
            || status.active & bit(uid) != 0
            || status.prepared == Some(uid as u8)
    }

    /// Live, unfinished Jobs the controller did not release (bits of their uids), as a list of
    /// Jobs shows them now: suspended ones, and ones someone else unsuspended.
    fn unreleased(&self) -> u16 {
        (0..self.njobs as usize)
            .filter(|&u| {
                let j = self.jobs[u];
                j.live && !j.resumed && !j.finished
            })
            .fold(0, |m, u| m | bit(u))
    }

    /// Whether the controller sees Job `uid` as started by someone else: unsuspended without
    /// its `released` mark.
    fn outside(&self, cfg: &Config, uid: usize) -> bool {
        cfg.external && cfg.broken != Broken::IgnoreExternalResume && self.jobs[uid].external
    }

    /// Jobs that `status`'s claims know and someone else unsuspended (without the controller's
    /// `released` mark), as a list of Jobs shows them now: `observe::started_outside`.
    fn started_outside(&self, cfg: &Config, status: &Status) -> Option<usize> {
        (0..self.njobs as usize)
            .find(|&u| self.jobs[u].live && self.outside(cfg, u) && self.known(status, u))
    }

    /// Whether the fence would accept a fenced write of pod `i` of Job `uid` now (its process
    /// must run): the token checks, then with [`Workload::Attempts`] the 3-argument fence (the
    /// newest registered attempt of the token), with [`Workload::TokenOnly`] the 2-argument one
    /// (refused once an attempt of the token registered, which no pod of this workload does).
    fn pod_accepts(&self, cfg: &Config, uid: usize, i: usize) -> bool {
        let job = &self.jobs[uid];
        let pod = job.pods[i];
        if !pod.alive || !fence_accepts(self, job.token) {
            return false;
        }
        match cfg.pods.map(|p| p.workload) {
            Some(Workload::Attempts) if cfg.broken == Broken::NoAttemptCheck => pod.begun != 0,
            Some(Workload::Attempts) => self.newest == attempt_id(uid, i),
            _ => self.newest_token() != Some(job.token),
        }
    }

    /// The token of the newest registered attempt, if any.
    fn newest_token(&self) -> Option<u8> {
        (self.newest != 0).then(|| self.jobs[(self.newest as usize - 1) / MAX_PODS].token)
    }

    /// Whether some fenced write of Job `uid` would be accepted now: with pods, of a pod whose
    /// process runs; without, of a Job that ran (a zombie pod may always be left).
    fn may_write(&self, cfg: &Config, uid: usize) -> bool {
        let job = &self.jobs[uid];
        if cfg.pods.is_some() {
            (0..job.npods as usize).any(|i| self.pod_accepts(cfg, uid, i))
        } else {
            job.resumed && fence_accepts(self, job.token)
        }
    }

    /// Whether nothing with `token` can pass the fence again: the fence is above it or it is
    /// retired (both only rise).
    fn fenced_out(&self, token: u8) -> bool {
        token < self.fence || token <= self.retired
    }

    /// The order number the next attempt to begin gets.
    fn next_begun(&self) -> u8 {
        let pods = self
            .jobs()
            .iter()
            .flat_map(|j| j.pods[..j.npods as usize].iter());
        pods.map(|p| p.begun).max().unwrap_or(0) + 1
    }

    /// The Jobs of `listed` that the sweeper deletes, judged by `status`.
    fn sweepable(&self, cfg: &Config, status: &Status, listed: u16) -> impl Iterator<Item = usize> {
        let mut status = *status;
        if cfg.broken == Broken::SweepIgnoresPending {
            status.pending = None;
        }
        let s = *self;
        uids(listed)
            .filter(move |&u| !s.known(&status, u))
            // Like the controller's (observe::unknown): a Job whose token is above every token
            // the status knows is news of a newer status, not an unknown Job.
            .filter(move |&u| {
                cfg.broken == Broken::SweepUnbounded || s.jobs[u].token <= status.token
            })
    }

    fn done_tokens(status: &Status) -> u32 {
        status.recorded.iter().fold(0, |m, r| match r {
            Rec::Done(t) | Rec::Failed(t) => m | 1 << t,
            _ => m,
        })
    }

    /// Writes `next` with a compare-and-swap on `rv` (blind when broken).
    fn cas(&mut self, cfg: &Config, rv: u16, next: Status) -> bool {
        if rv != self.rv && cfg.broken != Broken::BlindStatusWrite {
            return false; // 409 Conflict
        }
        self.status = next;
        self.rv += 1;
        self.done |= Self::done_tokens(&next);
        true
    }

    fn retire(&mut self, mask: u16, cov: &mut u64) {
        for u in uids(mask) {
            self.retired = self.retired.max(self.jobs[u].token);
        }
        *cov |= Cov::Retired.bit();
    }

    /// The Job starts running (resumed, or created running by the old protocol).
    fn start(&mut self, uid: usize) {
        let j = &mut self.jobs[uid];
        if !j.resumed && self.done & 1 << j.token != 0 {
            self.bad |= Inv::RetiredRan.bit();
        }
        // Without a backstop nothing is retired (0): every claim's token is above it.
        if !j.resumed && j.token <= self.retired {
            self.bad |= Inv::ResumedRetired.bit();
        }
        // Its instant is when its period falls due.
        if j.prepared && self.due <= j.period {
            self.bad |= Inv::ReleasedEarly.bit();
        }
        if j.withdrawn {
            self.bad |= Inv::WithdrawnRan.bit();
        }
        j.resumed = true;
    }

    /// Deletes Job `uid` if it still exists (a delete with a uid precondition). Its running
    /// pods are terminating (their processes may run on).
    fn delete(&mut self, uid: usize, by_replace: bool) {
        let j = &mut self.jobs[uid];
        if j.live {
            j.live = false;
            j.replaced = by_replace;
            for pod in &mut j.pods[..j.npods as usize] {
                if pod.phase == Phase::Running {
                    pod.phase = Phase::Terminating;
                }
            }
        }
    }

    /// Creates a Job for `claim` (suspended, or running under the old protocol).
    fn create(&mut self, cfg: &Config, claim: Claim, cov: &mut u64) -> usize {
        let uid = self.njobs as usize;
        if self
            .jobs()
            .iter()
            .any(|j| j.period == claim.period && j.token == claim.token)
        {
            *cov |= Cov::Recreated.bit();
        }
        if self.jobs().iter().any(|j| j.token >= claim.token) {
            *cov |= Cov::CreatedOutOfOrder.bit();
        }
        let withdrawn = |j: &Job| j.prepared && j.withdrawn && j.period == claim.period;
        if self.jobs().iter().any(withdrawn) {
            *cov |= Cov::PreparedPeriodAgain.bit();
        }
        self.jobs[uid] = Job {
            period: claim.period,
            token: claim.token,
            live: true,
            ..Job::default()
        };
        self.njobs += 1;
        if cfg.broken == Broken::OldProtocol {
            self.start(uid);
        }
        uid
    }
}

/// Whether the Job store is at the model's bound. The protocol never gets there (asserted); a
/// broken one may create Jobs without end, and its exploration stops creating them there.
fn full(cfg: &Config, s: &State) -> bool {
    let full = s.njobs as usize == MAX_JOBS;
    assert!(
        !full || cfg.broken != Broken::None,
        "more Jobs than the model's bound"
    );
    full
}

/// Step 1 for a reader of `s`: what to do next (the sweeper is offered separately).
fn plan(cfg: &Config, s: &State) -> Pc {
    let st = s.status;
    // The reconcile's check of the Jobs comes first: a Job its claims know that someone else
    // unsuspended is stopped.
    if let Some(uid) = s.started_outside(cfg, &st) {
        return stop(cfg, s, s.rv, &st, uid);
    }
    if let Some(claim) = st.pending {
        // A claim left half-done: complete it with its period, token and replaced runs.
        return after_claim(cfg, s.rv, st, claim, 0);
    }
    // A prepared run is settled first: resumed at its instant, promoted, or withdrawn; kept
    // (nothing else done) before its instant.
    if let Some(uid) = st.prepared {
        return prepared::settle(cfg, s, uid);
    }
    if cfg.broken != Broken::NoResumeRepair
        && let Some(uid) = uids(st.active).find(|&u| s.jobs[u].live && s.jobs[u].suspended())
    {
        return Pc::Resume {
            uid: uid as u8,
            replaces: 0,
        };
    }
    let mut next = st;
    // Runs whose Job finished or is gone leave `active`, their outcome recorded.
    let gone = uids(st.active)
        .filter(|&u| !s.jobs[u].live || s.jobs[u].finished)
        .fold(0, |m, u| m | bit(u));
    next.active &= !gone;
    for u in uids(gone) {
        next.recorded[s.jobs[u].period as usize] = Rec::Done(s.jobs[u].token);
    }
    let (retire, late) = if !cfg.backstop || gone == 0 || cfg.broken == Broken::NoRetirement {
        (0, 0)
    } else if cfg.broken == Broken::RetireAfterRecord {
        (0, gone)
    } else {
        (gone, 0)
    };
    if st.decided < s.due {
        // catchUp Latest: older due periods are recorded as Missed with the claim.
        let newest = s.due - 1;
        let blocked = cfg.policy == Policy::Forbid && next.active != 0;
        if !blocked {
            if cfg.broken != Broken::SilentMiss {
                for p in st.decided..newest {
                    next.recorded[p as usize] = Rec::Missed;
                }
            }
            next.decided = newest;
            let replaces = if cfg.policy == Policy::Replace {
                next.active
            } else {
                0
            };
            return Pc::Token {
                rv: s.rv,
                next,
                period: newest,
                replaces,
                retire,
                late,
            };
        }
    }
    if next != st {
        Pc::Write {
            rv: s.rv,
            next,
            retire,
            late,
        }
    } else {
        Pc::Idle
    }
}

/// The stop of Job `uid`, which someone else unsuspended, judged by `status` read at `rv`: its
/// token retired (with the backstop), then the status written by a CAS on `rv` with the claim
/// that knew it gone (pending cleared, or out of `active`) and its period decided Failed
/// (StartedBeforeConfirm), then the Job deleted by uid: `sweep::stop_run`.
fn stop(cfg: &Config, s: &State, rv: u16, status: &Status, uid: usize) -> Pc {
    let job = s.jobs[uid];
    let mut next = *status;
    if next.pending.is_some_and(|c| c.period == job.period) {
        next.pending = None;
    }
    for u in uids(status.active).filter(|&u| s.jobs[u].period == job.period) {
        next.active &= !bit(u);
    }
    next.recorded[job.period as usize] = Rec::Failed(job.token);
    Pc::Stop {
        rv,
        next,
        uid: uid as u8,
        retired: !cfg.backstop || cfg.broken == Broken::StopWithoutRetire,
    }
}

/// Where a claim goes once written (or found pending): step 4, or 5 without a backstop.
fn after_claim(cfg: &Config, rv: u16, base: Status, claim: Claim, late: u16) -> Pc {
    if cfg.backstop {
        Pc::Backstop {
            rv,
            base,
            claim,
            late,
        }
    } else {
        Pc::Recheck { claim }
    }
}

fn c(claim: Claim) -> String {
    format!("p{}/t{}", claim.period, claim.token)
}

fn j(s: &State, uid: usize) -> String {
    let job = s.jobs[uid];
    format!("Job#{uid} (p{}/t{})", job.period, job.token)
}

fn mask(s: &State, m: u16) -> String {
    let v: Vec<String> = uids(m).map(|u| j(s, u)).collect();
    format!("[{}]", v.join(", "))
}

macro_rules! say {
    ($on:expr, $($t:tt)*) => {
        if $on { format!($($t)*) } else { String::new() }
    };
}

// After `say!`, which it uses (a macro is in scope from its definition on).
/// Prepared runs (issue 33): the judge, RESUME-PREPARED, PROMOTE, WITHDRAW and the environment's
/// PREPARE and EDIT.
#[path = "model/prepared.rs"]
mod prepared;

/// The steps actor `a` can take in `s` (several only when idle: a plan, or a sweep).
fn step(cfg: &Config, s: &State, a: usize, on: bool, cov: &mut u64, out: &mut Out) {
    let mut n = *s;
    let name = NAMES[a];
    let label;
    match s.actors[a] {
        Pc::Idle => {
            if s.leader as usize != a {
                return;
            }
            let pc = plan(cfg, s);
            if matches!(pc, Pc::Resume { .. }) {
                *cov |= Cov::ResumeRepaired.bit();
            }
            if pc != Pc::Idle {
                n.actors[a] = pc;
                out.push((n, say!(on, "{name} reads rv {} and plans {pc:?}", s.rv)));
            }
            // The sweeper's round, as the controller's reconcile does it: read status, then list
            // the Jobs (the cache, later), then delete.
            let mut n = *s;
            {
                // The resourceVersion matters only to a stop's status write.
                let rv = if cfg.external { s.rv } else { 0 };
                n.actors[a] = Pc::SweepRead {
                    status: s.status,
                    rv,
                };
                out.push((n, say!(on, "{name} reads rv {} to sweep", s.rv)));
            }
            return;
        }
        Pc::Token {
            rv,
            next,
            period,
            replaces,
            retire,
            late,
        } => {
            if retire != 0 {
                n.retire(retire, cov);
                label = say!(on, "{name} retires the tokens of {}", mask(s, retire));
                n.actors[a] = Pc::Token {
                    rv,
                    next,
                    period,
                    replaces,
                    retire: 0,
                    late,
                };
            } else {
                let fence = if cfg.backstop { s.fence } else { 0 };
                let claim = Claim {
                    period,
                    token: next.token.max(fence) + 1,
                    replaces,
                };
                label = say!(
                    on,
                    "{name} computes token {} for period {period}",
                    claim.token
                );
                n.actors[a] = Pc::Claim {
                    rv,
                    next,
                    claim,
                    late,
                    created: false,
                };
            }
        }
        Pc::Claim {
            rv,
            mut next,
            claim,
            late,
            created,
        } => {
            if cfg.broken == Broken::CreateBeforeClaim && !created {
                if s.live_job(claim.period).is_none() {
                    if full(cfg, s) {
                        return;
                    }
                    let uid = n.create(cfg, claim, cov);
                    label = say!(
                        on,
                        "{name} creates {} before its claim (broken)",
                        j(&n, uid)
                    );
                    n.actors[a] = Pc::Claim {
                        rv,
                        next,
                        claim,
                        late,
                        created: true,
                    };
                } else {
                    label = say!(on, "{name} finds the name of {} taken", c(claim));
                    n.actors[a] = Pc::Idle;
                }
            } else {
                next.token = claim.token;
                next.decided = claim.period + 1;
                next.pending = Some(claim);
                if n.cas(cfg, rv, next) {
                    label = say!(on, "{name} claims {claim:?} (rv {rv} -> {})", n.rv);
                    n.actors[a] = after_claim(cfg, n.rv, next, claim, late);
                } else {
                    label = say!(
                        on,
                        "{name}'s claim of {} gets 409 (rv {rv} != {})",
                        c(claim),
                        s.rv
                    );
                    n.actors[a] = Pc::Idle;
                }
            }
        }
        Pc::Backstop {
            rv,
            base,
            claim,
            late,
        } => {
            let p = claim.period as usize;
            if late != 0 {
                n.retire(late, cov);
                label = say!(on, "{name} retires the tokens of {} (late)", mask(s, late));
                n.actors[a] = Pc::Backstop {
                    rv,
                    base,
                    claim,
                    late: 0,
                };
            } else {
                match s.rows[p] {
                    // Our own row, its token retired: a stop of the claim's Job (started by
                    // someone else) retired it and did not get to write its decision. No Job is
                    // created with a retired token: the period is decided Failed now.
                    Some(t) if t == claim.token && claim.token <= s.retired => {
                        *cov |= Cov::RetiredClaimDecided.bit();
                        label = say!(
                            on,
                            "{name} finds its own claim row {} retired: decides it Failed",
                            c(claim)
                        );
                        let mut next = base;
                        next.pending = None;
                        next.recorded[p] = Rec::Failed(claim.token);
                        n.actors[a] = Pc::Write {
                            rv,
                            next,
                            retire: 0,
                            late: 0,
                        };
                    }
                    Some(t) if t == claim.token => {
                        label = say!(on, "{name} finds its own claim row {}", c(claim));
                        n.actors[a] = Pc::Recheck { claim };
                    }
                    Some(t) => {
                        *cov |= Cov::Deduplicated.bit();
                        label = say!(on, "{name}: period {p} already claimed with token {t}");
                        let mut next = base;
                        next.pending = None;
                        next.recorded[p] = Rec::Deduplicated;
                        n.actors[a] = Pc::Write {
                            rv,
                            next,
                            retire: 0,
                            late: 0,
                        };
                    }
                    None if s.fence < claim.token => {
                        n.rows[p] = Some(claim.token);
                        if cfg.broken != Broken::RowWithoutFence {
                            n.fence = claim.token;
                        }
                        label = say!(
                            on,
                            "{name} inserts claim row {}, fence -> {}",
                            c(claim),
                            n.fence
                        );
                        n.actors[a] = Pc::Recheck { claim };
                    }
                    None => {
                        *cov |= Cov::Reclaimed.bit();
                        let token = base.token.max(s.fence) + 1;
                        label = say!(
                            on,
                            "{name}: token {} stale (fence {}): re-claims with {token}",
                            claim.token,
                            s.fence
                        );
                        n.actors[a] = Pc::Reclaim {
                            rv,
                            base,
                            claim: Claim { token, ..claim },
                        };
                    }
                }
            }
        }
        Pc::Reclaim { rv, base, claim } => {
            let mut next = base;
            next.token = claim.token;
            next.pending = Some(claim);
            if n.cas(cfg, rv, next) {
                label = say!(on, "{name} re-claims {} (rv {rv} -> {})", c(claim), n.rv);
                n.actors[a] = after_claim(cfg, n.rv, next, claim, 0);
            } else {
                label = say!(on, "{name}'s re-claim of {} gets 409", c(claim));
                n.actors[a] = Pc::Idle;
            }
        }
        Pc::Recheck { claim } => {
            if s.status.pending == Some(claim) {
                label = say!(
                    on,
                    "{name} re-reads rv {}: {} still pending",
                    s.rv,
                    c(claim)
                );
                let (rv, base) = (s.rv, s.status);
                n.actors[a] = if claim.replaces != 0 && cfg.broken != Broken::ReplaceAfterResume {
                    Pc::Replace { rv, base, claim }
                } else {
                    Pc::Create { rv, base, claim }
                };
            } else {
                *cov |= Cov::RecheckFailed.bit();
                label = say!(
                    on,
                    "{name} re-reads rv {}: {} no longer pending",
                    s.rv,
                    c(claim)
                );
                n.actors[a] = Pc::Idle;
            }
        }
        Pc::Replace { rv, base, claim } => {
            for u in uids(claim.replaces) {
                n.delete(u, true);
            }
            label = say!(
                on,
                "{name} deletes the replaced {}",
                mask(s, claim.replaces)
            );
            n.actors[a] = Pc::Create { rv, base, claim };
        }
        Pc::Create { rv, base, claim } => match s.live_job(claim.period) {
            // The claim's own Job, started by someone else before its confirm (a create that came
            // back running and was not stopped yet, or a resumer): stopped as a create that comes
            // back not suspended is (`create::name_taken`).
            Some(u) if s.jobs[u].token == claim.token && s.outside(cfg, u) => {
                *cov |= Cov::OwnJobStopped.bit();
                label = say!(
                    on,
                    "{name} finds {} with its token started by someone else: stops it",
                    j(s, u)
                );
                n.actors[a] = stop(cfg, s, rv, &base, u);
            }
            Some(u) if s.jobs[u].token == claim.token => {
                *cov |= Cov::Adopted.bit();
                label = say!(on, "{name} finds {} with its token: adopts it", j(s, u));
                n.actors[a] = Pc::Confirm {
                    rv,
                    base,
                    claim,
                    uid: u as u8,
                };
            }
            Some(u) if s.jobs[u].suspended() && !s.known(&base, u) => {
                label = say!(
                    on,
                    "{name} finds {} suspended and unknown: deletes it",
                    j(s, u)
                );
                n.actors[a] = Pc::DeleteForeign {
                    rv,
                    base,
                    claim,
                    uid: u as u8,
                };
            }
            Some(u) => {
                *cov |= Cov::ForeignRecorded.bit();
                label = say!(on, "{name} finds {}: records ForeignJob", j(s, u));
                let mut next = base;
                next.pending = None;
                next.recorded[claim.period as usize] = Rec::ForeignJob;
                n.actors[a] = Pc::Write {
                    rv,
                    next,
                    retire: 0,
                    late: 0,
                };
            }
            None => {
                if full(cfg, s) {
                    return;
                }
                if cfg.external && !s.external {
                    // A mutating webhook clears spec.suspend at create: the API server returns
                    // the Job not suspended, and its pods may start at once.
                    let mut w = *s;
                    let uid = w.create(cfg, claim, cov);
                    w.jobs[uid].external = true;
                    w.external = true;
                    let l = say!(
                        on,
                        "{name} creates {}: it comes back not suspended",
                        j(&w, uid)
                    );
                    if cfg.broken == Broken::IgnoreExternalResume {
                        w.actors[a] = Pc::Confirm {
                            rv,
                            base,
                            claim,
                            uid: uid as u8,
                        };
                    } else {
                        *cov |= Cov::NotSuspendedAtCreate.bit();
                        let mut next = base;
                        next.pending = None;
                        next.recorded[claim.period as usize] = Rec::Failed(claim.token);
                        let uid = uid as u8;
                        w.actors[a] = if cfg.broken == Broken::DeleteBeforeRetire {
                            Pc::NotSuspended { rv, next, uid }
                        } else {
                            Pc::Stop {
                                rv,
                                next,
                                uid,
                                retired: !cfg.backstop || cfg.broken == Broken::StopWithoutRetire,
                            }
                        };
                    }
                    out.push((w, l));
                }
                let uid = n.create(cfg, claim, cov);
                let how = if cfg.broken == Broken::OldProtocol {
                    "running"
                } else {
                    "suspended"
                };
                label = say!(on, "{name} creates {} {how}", j(&n, uid));
                n.actors[a] = Pc::Confirm {
                    rv,
                    base,
                    claim,
                    uid: uid as u8,
                };
            }
        },
        Pc::DeleteForeign {
            rv,
            base,
            claim,
            uid,
        } => {
            *cov |= Cov::ForeignDeleted.bit();
            n.delete(uid as usize, false);
            label = say!(on, "{name} deletes {} by uid", j(s, uid as usize));
            n.actors[a] = Pc::Create { rv, base, claim };
        }
        Pc::Confirm {
            rv,
            base,
            claim,
            uid,
        } => {
            let mut next = base;
            next.pending = None;
            for u in uids(claim.replaces) {
                next.recorded[s.jobs[u].period as usize] = Rec::Done(s.jobs[u].token);
            }
            next.active = (next.active & !claim.replaces) | bit(uid as usize);
            next.recorded[claim.period as usize] = Rec::Running(claim.token);
            if n.cas(cfg, rv, next) {
                n.jobs[uid as usize].confirmed = true;
                label = say!(
                    on,
                    "{name} confirms {} (rv {rv} -> {})",
                    j(s, uid as usize),
                    n.rv
                );
                n.actors[a] = match cfg.broken {
                    Broken::OldProtocol => Pc::Idle,
                    Broken::ReplaceAfterResume => Pc::Resume {
                        uid,
                        replaces: claim.replaces,
                    },
                    _ => Pc::Resume { uid, replaces: 0 },
                };
            } else {
                label = say!(on, "{name}'s confirm of {} gets 409", j(s, uid as usize));
                n.actors[a] = if cfg.broken == Broken::ResumeOnLostConfirm {
                    Pc::Resume { uid, replaces: 0 }
                } else {
                    Pc::Lost { claim, uid }
                };
            }
        }
        Pc::Lost { claim, uid } => {
            let u = uid as usize;
            let keep = if cfg.broken == Broken::OldProtocol {
                s.known(&s.status, u)
            } else {
                s.status.active & bit(u) != 0
            };
            if keep {
                *cov |= Cov::LostConfirmResumed.bit();
                label = say!(
                    on,
                    "{name} re-reads rv {}: the winner has {}",
                    s.rv,
                    j(s, u)
                );
                n.actors[a] = if cfg.broken == Broken::OldProtocol {
                    Pc::Idle
                } else {
                    Pc::Resume { uid, replaces: 0 }
                };
            } else {
                label = say!(
                    on,
                    "{name} re-reads rv {}: {} unknown to the winner ({})",
                    s.rv,
                    j(s, u),
                    c(claim)
                );
                n.actors[a] = Pc::DeleteOwn { uid };
            }
        }
        Pc::DeleteOwn { uid } => {
            *cov |= Cov::LostConfirmDeleted.bit();
            n.delete(uid as usize, false);
            label = say!(on, "{name} deletes its {} by uid", j(s, uid as usize));
            n.actors[a] = Pc::Idle;
        }
        Pc::Resume { uid, replaces } => {
            let u = uid as usize;
            if s.jobs[u].live && s.jobs[u].external {
                // The patch tests suspend == true: it fails, and the Job keeps no mark.
                *cov |= Cov::ResumeFoundStarted.bit();
                label = say!(on, "{name}'s resume of {}: already unsuspended", j(s, u));
            } else if s.jobs[u].live {
                n.start(u);
                label = say!(on, "{name} resumes {}", j(s, u));
            } else {
                *cov |= Cov::ResumeNotFound.bit();
                label = say!(on, "{name}'s resume of {}: 404", j(s, u));
            }
            n.actors[a] = if replaces != 0 {
                Pc::LateReplace { replaces }
            } else {
                Pc::Idle
            };
        }
        Pc::LateReplace { replaces } => {
            for u in uids(replaces) {
                n.delete(u, true);
            }
            label = say!(
                on,
                "{name} deletes the replaced {} (late)",
                mask(s, replaces)
            );
            n.actors[a] = Pc::Idle;
        }
        Pc::SweepRead { status, rv } => {
            let listed = s.unreleased();
            let before = out.len();
            if let Some(uid) = s.started_outside(cfg, &status) {
                let mut n = *s;
                n.actors[a] = stop(cfg, s, rv, &status, uid);
                let l = say!(
                    on,
                    "{name} finds {} started without the controller's release: stops it",
                    j(s, uid)
                );
                out.push((n, l));
            }
            for uid in s.sweepable(cfg, &status, listed) {
                let mut n = *s;
                n.actors[a] = Pc::Sweep { uid: uid as u8 };
                let l = say!(
                    on,
                    "{name} finds {} unknown to the status read: sweeps it",
                    j(s, uid)
                );
                out.push((n, l));
            }
            if out.len() == before {
                let mut n = *s;
                n.actors[a] = Pc::Idle;
                out.push((n, say!(on, "{name} finds nothing to sweep")));
            }
            return;
        }
        Pc::Stop {
            rv,
            next,
            uid,
            retired,
        } => {
            let u = uid as usize;
            if !retired {
                n.retire(bit(u), cov);
                label = say!(on, "{name} retires the token of {}", j(s, u));
                n.actors[a] = Pc::Stop {
                    rv,
                    next,
                    uid,
                    retired: true,
                };
            } else if cfg.broken == Broken::DeleteBeforeRecord {
                *cov |= Cov::ExternalStopped.bit();
                n.delete(u, false);
                label = say!(on, "{name} deletes {} by uid (stopped, broken)", j(s, u));
                n.actors[a] = Pc::Write {
                    rv,
                    next,
                    retire: 0,
                    late: 0,
                };
            } else if n.cas(cfg, rv, next) {
                label = say!(
                    on,
                    "{name} records the stop of {}: writes status {next:?} (rv {rv} -> {})",
                    j(s, u),
                    n.rv
                );
                n.actors[a] = Pc::StopDelete { uid };
            } else {
                label = say!(on, "{name}'s record of the stop of {} gets 409", j(s, u));
                n.actors[a] = Pc::Idle;
            }
        }
        Pc::StopDelete { uid } => {
            *cov |= Cov::ExternalStopped.bit();
            n.delete(uid as usize, false);
            label = say!(on, "{name} deletes {} by uid (stopped)", j(s, uid as usize));
            n.actors[a] = Pc::Idle;
        }
        Pc::NotSuspended { rv, next, uid } => {
            let u = uid as usize;
            n.delete(u, false);
            label = say!(on, "{name} deletes {} by uid (not suspended)", j(s, u));
            let retire = if cfg.backstop && cfg.broken != Broken::StopWithoutRetire {
                bit(u)
            } else {
                0
            };
            n.actors[a] = Pc::Write {
                rv,
                next,
                retire,
                late: 0,
            };
        }
        Pc::Sweep { uid } => {
            *cov |= Cov::Swept.bit();
            if s.jobs[uid as usize].withdrawn {
                *cov |= Cov::WithdrawnSwept.bit();
            }
            n.delete(uid as usize, false);
            label = say!(on, "{name} sweeps {} by uid", j(s, uid as usize));
            n.actors[a] = Pc::Idle;
        }
        Pc::Write {
            rv,
            next,
            retire,
            late,
        } => {
            if retire != 0 {
                n.retire(retire, cov);
                label = say!(on, "{name} retires the tokens of {}", mask(s, retire));
                n.actors[a] = Pc::Write {
                    rv,
                    next,
                    retire: 0,
                    late,
                };
            } else if n.cas(cfg, rv, next) {
                label = say!(on, "{name} writes status {next:?} (rv {rv} -> {})", n.rv);
                n.actors[a] = if late != 0 {
                    Pc::Retire { retire: late }
                } else {
                    Pc::Idle
                };
            } else {
                label = say!(on, "{name}'s status write gets 409");
                n.actors[a] = Pc::Idle;
            }
        }
        Pc::Retire { retire } => {
            n.retire(retire, cov);
            label = say!(
                on,
                "{name} retires the tokens of {} (late)",
                mask(s, retire)
            );
            n.actors[a] = Pc::Idle;
        }
        Pc::ResumePrepared { .. }
        | Pc::ResumeReread { .. }
        | Pc::Promote { .. }
        | Pc::Withdraw { .. } => label = prepared::step(cfg, s, a, on, cov, &mut n),
    }
    out.push((n, label));
}

type Out = Vec<(State, String)>;

/// Every transition from `s`, into `out` (labelled when `on`); `cov` collects the paths taken.
fn successors(cfg: &Config, s: &State, on: bool, cov: &mut u64, out: &mut Out) {
    out.clear();
    for (a, name) in NAMES.iter().enumerate() {
        step(cfg, s, a, on, cov, out);
        if s.actors[a] != Pc::Idle {
            let mut n = *s;
            n.actors[a] = Pc::Idle;
            out.push((n, say!(on, "{name} crashes and restarts")));
        }
    }
    for b in (0..ACTORS).filter(|&b| b != s.leader as usize) {
        let mut n = *s;
        n.leader = b as u8;
        out.push((n, say!(on, "leadership moves to {}", NAMES[b])));
    }
    if s.due < PERIODS {
        let mut n = *s;
        n.due += 1;
        out.push((n, say!(on, "period {} falls due", s.due)));
    }
    if cfg.backstop && cfg.bump && !s.bumped {
        let mut n = *s;
        n.bumped = true;
        // Break-lock's step 1b first: a prepared run's Job is marked withdrawn (LockBroken).
        let marked = match prepared::break_lock_mark(&mut n, cov) {
            true => "the prepared Job is marked withdrawn (break-lock 1b), then ",
            false => "",
        };
        n.fence = s.status.token.max(s.fence) + 1;
        out.push((
            n,
            say!(on, "{marked}the fence rises to {} (break-lock)", n.fence),
        ));
    }
    if cfg.prepare {
        prepared::environment(cfg, s, on, out);
    }
    if cfg.backstop && cfg.foreign_row && !s.foreign {
        for p in 0..PERIODS {
            if s.rows[p as usize].is_none() {
                let mut n = *s;
                n.foreign = true;
                n.rows[p as usize] = Some(0);
                out.push((
                    n,
                    say!(
                        on,
                        "an earlier incarnation's claim row for period {p} appears"
                    ),
                ));
            }
        }
    }
    if cfg.foreign && !s.foreign && !full(cfg, s) {
        for p in 0..PERIODS {
            if s.live_job(p).is_none() {
                for running in [false, true] {
                    let mut n = *s;
                    n.foreign = true;
                    let uid = n.njobs as usize;
                    n.jobs[uid] = Job {
                        period: p,
                        token: 0,
                        live: true,
                        resumed: running,
                        ..Job::default()
                    };
                    n.njobs += 1;
                    let how = if running { "running" } else { "suspended" };
                    out.push((n, say!(on, "a foreign {} appears, {how}", j(&n, uid))));
                }
            }
        }
    }
    if cfg.external && !s.external {
        for (u, job) in s.jobs().iter().enumerate() {
            if job.live && job.suspended() && job.token != 0 {
                let mut n = *s;
                n.external = true;
                n.jobs[u].external = true;
                let l = say!(on, "someone unsuspends {} (no released mark)", j(s, u));
                out.push((n, l));
            }
        }
    }
    for (u, job) in s.jobs().iter().enumerate() {
        // With pods, a Job whose token is fenced out keeps none (see [`canon`]): it finishes
        // (its pods fail or succeed) as a Job that ran does without pods.
        let fenced = cfg.pods.is_some() && s.fenced_out(job.token);
        if (cfg.pods.is_none() || fenced) && job.live && job.started() && !job.finished {
            let mut n = *s;
            n.jobs[u].finished = true;
            out.push((n, say!(on, "{} finishes", j(s, u))));
        }
        if cfg.prune && job.live && job.finished && s.status.active & bit(u) == 0 {
            let mut n = *s;
            n.delete(u, false);
            out.push((n, say!(on, "finished {} is pruned", j(s, u))));
        }
    }
    if let Some(pods) = cfg.pods {
        pod_steps(&pods, cfg.external, s, on, out);
    }
}

/// The Job controller, the kubelet and the workload: pods are created, deleted or evicted,
/// fail, succeed, end after their grace period or are force-deleted on a partition, and each
/// attempt of [`Workload::Attempts`] registers once (a step of the database: atomic, under the
/// fence row's lock; refused, the attempt exits).
fn pod_steps(pods: &Pods, external: bool, s: &State, on: bool, out: &mut Out) {
    for (u, job) in s.jobs().iter().enumerate() {
        if s.fenced_out(job.token) {
            continue;
        }
        let np = job.npods as usize;
        let here = &job.pods[..np];
        // The Job controller: a pod for a started, live, unfinished Job when none is active by
        // the replacement policy; with the pods used up and none running, the Job fails.
        let blocking = here.iter().any(|p| {
            p.phase == Phase::Running
                || (p.phase == Phase::Terminating && pods.replacement == Replacement::Failed)
        });
        if job.live && job.started() && !job.finished && !blocking {
            let mut n = *s;
            if np < MAX_PODS {
                let begun = if pods.workload == Workload::TokenOnly {
                    s.next_begun()
                } else {
                    0
                };
                n.jobs[u].pods[np] = Pod {
                    phase: Phase::Running,
                    alive: true,
                    begun,
                };
                n.jobs[u].npods += 1;
                n.jobs[u].wrote |= begun != 0 && external;
                out.push((
                    n,
                    say!(on, "the Job controller creates pod {np} of {}", j(s, u)),
                ));
            } else {
                n.jobs[u].finished = true;
                out.push((n, say!(on, "{} fails (backoff limit)", j(s, u))));
            }
        }
        for (i, pod) in here.iter().enumerate() {
            let mut go = |f: &dyn Fn(&mut State), what: &str| {
                let mut n = *s;
                f(&mut n);
                out.push((n, say!(on, "pod {i} of {} {what}", j(s, u))));
            };
            match pod.phase {
                Phase::Running => {
                    go(
                        &|n| n.jobs[u].pods[i].phase = Phase::Terminating,
                        "is deleted or evicted (its process runs on)",
                    );
                    go(
                        &|n| {
                            n.jobs[u].pods[i] = Pod {
                                phase: Phase::Terminal,
                                alive: false,
                                ..n.jobs[u].pods[i]
                            }
                        },
                        "fails",
                    );
                    go(
                        &|n| {
                            n.jobs[u].pods[i] = Pod {
                                phase: Phase::Terminal,
                                alive: false,
                                ..n.jobs[u].pods[i]
                            };
                            n.jobs[u].finished = true;
                        },
                        "succeeds: its Job finishes",
                    );
                }
                Phase::Terminating => {
                    go(
                        &|n| {
                            n.jobs[u].pods[i] = Pod {
                                phase: Phase::Terminal,
                                alive: false,
                                ..n.jobs[u].pods[i]
                            }
                        },
                        "ends (grace period over)",
                    );
                    if pods.partition {
                        go(
                            &|n| n.jobs[u].pods[i].phase = Phase::Terminal,
                            "is force-deleted (PodGC) while its process runs on a partitioned node",
                        );
                    }
                }
                Phase::Terminal => {}
            }
            // Its token is not fenced out (else the Job keeps no pods), so the registration is
            // accepted: it becomes the newest attempt. (Once its token is fenced out, the
            // registration would be refused and the attempt exit: the Job fails or finishes.)
            if pods.workload == Workload::Attempts && pod.alive && pod.begun == 0 {
                let mut n = *s;
                n.newest = attempt_id(u, i);
                n.jobs[u].pods[i].begun = s.next_begun();
                n.jobs[u].wrote |= external;
                let l = say!(
                    on,
                    "pod {i} of {} registers as attempt #{}",
                    j(s, u),
                    n.jobs[u].pods[i].begun
                );
                out.push((n, l));
            }
        }
    }
}

impl Pc {
    /// The resourceVersion this actor's next compare-and-swap carries, if it holds one.
    fn rv(&mut self) -> Option<&mut u16> {
        match self {
            Pc::Token { rv, .. }
            | Pc::Claim { rv, .. }
            | Pc::Backstop { rv, .. }
            | Pc::Reclaim { rv, .. }
            | Pc::Replace { rv, .. }
            | Pc::Create { rv, .. }
            | Pc::DeleteForeign { rv, .. }
            | Pc::Confirm { rv, .. }
            | Pc::SweepRead { rv, .. }
            | Pc::Stop { rv, .. }
            | Pc::NotSuspended { rv, .. }
            | Pc::Write { rv, .. }
            | Pc::ResumePrepared { rv, .. }
            | Pc::ResumeReread { rv, .. }
            | Pc::Promote { rv, .. }
            | Pc::Withdraw { rv, .. } => Some(rv),
            _ => None,
        }
    }
}

/// The canonical form of a state, which the visited set holds. A resourceVersion only matters
/// by whether it is the current one (a compare-and-swap succeeds on it, on any other one it
/// fails), so it is 1 when current and 0 when stale; and the actors are interchangeable (the
/// leader moves with them), so they are kept in order (of several in the leader's state, the
/// first leads).
fn canon(cfg: &Config, mut s: State) -> State {
    if cfg.broken != Broken::BlindStatusWrite {
        for pc in &mut s.actors {
            if let Some(rv) = pc.rv() {
                *rv = u16::from(*rv == s.rv);
            }
        }
        s.rv = 1;
    }
    if cfg.pods.is_some() {
        // Nothing of a Job whose token is fenced out can be accepted again, and the controller
        // does not look at pods: its pods are dropped (it may still finish, see `successors`),
        // and so is the newest attempt when it is one of them. Whether a deleted Job had
        // finished matters to nobody.
        for u in 0..s.njobs as usize {
            if s.fenced_out(s.jobs[u].token) {
                s.jobs[u].pods = [Pod::default(); MAX_PODS];
                s.jobs[u].npods = 0;
            }
            if !s.jobs[u].live {
                s.jobs[u].finished = false;
            }
        }
        if s.newest_token().is_some_and(|t| s.fenced_out(t)) {
            s.newest = 0;
        }
        // Only the order in which attempts began matters: numbered 1, 2, ... without gaps.
        let mut order = [0u8; MAX_JOBS * MAX_PODS];
        let mut k = 0;
        for job in s.jobs() {
            for pod in &job.pods[..job.npods as usize] {
                if pod.begun != 0 {
                    order[k] = pod.begun;
                    k += 1;
                }
            }
        }
        let order = &mut order[..k];
        order.sort_unstable();
        for job in &mut s.jobs[..s.njobs as usize] {
            for pod in &mut job.pods[..job.npods as usize] {
                if pod.begun != 0 {
                    pod.begun = order.iter().position(|&b| b == pod.begun).unwrap() as u8 + 1;
                }
            }
        }
    }
    if s.status.prepared.is_none() {
        // The edit matters only to the judge of a prepared run, and a run is prepared once.
        s.edited = false;
    }
    let leader = s.actors[s.leader as usize];
    s.actors.sort_unstable();
    s.leader = s.actors.iter().position(|pc| *pc == leader).unwrap() as u8;
    s
}

/// Whether `singleton_fence` would accept a write with `token` now.
fn fence_accepts(s: &State, token: u8) -> bool {
    token >= s.fence && token > s.retired
}

/// The invariants `s` violates (bits of [`Inv`]).
fn violations(cfg: &Config, s: &State) -> u32 {
    let mut out = s.bad;
    // Runs of this SingletonJob's claims (a foreign Job, token 0, is none of them).
    let ours = |j: &&Job| j.resumed && j.token != 0;
    for (i, a) in s.jobs().iter().enumerate().filter(|(_, j)| ours(j)) {
        let later = s.jobs()[i + 1..].iter().filter(ours);
        for b in later {
            if b.period == a.period {
                out |= Inv::G1.bit();
            }
            if b.token == a.token {
                out |= Inv::TokenRanTwice.bit();
            }
            if b.token <= a.token {
                out |= Inv::G3.bit();
            }
        }
        if cfg.backstop && a.token > s.fence {
            out |= Inv::G5Fence.bit();
        }
    }
    // Every Job that ran (also one someone else started) whose write the fence would accept.
    for (u, a) in s.jobs().iter().enumerate() {
        if cfg.backstop && a.token != 0 && a.started() && s.may_write(cfg, u) {
            // The fence reaches a token before its Job exists, so a Job with a newer token
            // (even one that never runs) means a newer token was issued to the fence.
            if s.jobs().iter().any(|b| b.token > a.token) {
                out |= Inv::FenceOlder.bit();
            }
            if s.done & 1 << a.token != 0 {
                out |= Inv::FenceRetired.bit();
            }
        }
    }
    if cfg.pods.is_some() {
        out |= attempt_violations(cfg, s);
    }
    if cfg.external {
        for p in 0..PERIODS {
            let wrote = s
                .jobs()
                .iter()
                .filter(|j| j.period == p && j.token != 0 && j.wrote);
            if wrote.count() > 1 {
                out |= Inv::ExternallyStarted.bit();
            }
        }
        let adopted = |j: &Job| {
            j.live
                && j.external
                && j.confirmed
                && s.status.recorded[j.period as usize] == Rec::Done(j.token)
        };
        if s.jobs().iter().any(adopted) {
            out |= Inv::ExternalAdopted.bit();
        }
    }
    if s.jobs()
        .iter()
        .filter(ours)
        .filter(|j| j.live && !j.finished)
        .count()
        > 1
    {
        out |= Inv::G5Two.bit();
    }
    if s.jobs()
        .iter()
        .any(|j| j.confirmed && !j.resumed && !j.live && !j.replaced && !j.external)
    {
        out |= Inv::G2Lost.bit();
    }
    if s.status.pending.is_none()
        && (0..s.status.decided).any(|p| s.status.recorded[p as usize] == Rec::None)
    {
        out |= Inv::G2Decided.bit();
    }
    let quiet = quiescent(cfg, s);
    if quiet && (s.status.decided < PERIODS || s.status.active != 0) {
        out |= Inv::G2Quiet.bit();
    }
    if cfg.prepare && quiet {
        out |= prepared::lost(s);
    }
    out
}

/// [`Inv::AttemptsOverlap`] and [`Inv::TwoAttemptsWrite`], over the pods whose write the fence
/// would accept now.
fn attempt_violations(cfg: &Config, s: &State) -> u32 {
    let mut out = 0;
    let pods = || {
        s.jobs()
            .iter()
            .enumerate()
            .flat_map(|(u, j)| (0..j.npods as usize).map(move |i| (u, i, j.token, j.pods[i])))
    };
    for (u, i, token, pod) in pods().filter(|&(u, i, _, _)| s.pod_accepts(cfg, u, i)) {
        let same = || pods().filter(move |&(v, k, t, _)| t == token && (v, k) != (u, i));
        if same().any(|(v, k, _, _)| s.pod_accepts(cfg, v, k)) {
            out |= Inv::TwoAttemptsWrite.bit();
        }
        if pod.begun != 0 && same().any(|(_, _, _, q)| q.begun > pod.begun) {
            out |= Inv::AttemptsOverlap.bit();
        }
    }
    out
}

/// All periods due, nobody mid-step, nothing for a reader to do and no run that could finish.
fn quiescent(cfg: &Config, s: &State) -> bool {
    s.due == PERIODS
        && s.actors.iter().all(|p| *p == Pc::Idle)
        && plan(cfg, s) == Pc::Idle
        && s.sweepable(cfg, &s.status, s.unreleased()).next().is_none()
        && !s
            .jobs()
            .iter()
            .any(|j| j.live && j.started() && !j.finished)
}

/// A fast hash for the visited set (std's SipHash dominates the run time in a debug build).
#[derive(Default)]
struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64);
    }
    fn write_u16(&mut self, i: u16) {
        self.write_u64(i as u64);
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type Visited = HashMap<State, u32, BuildHasherDefault<Fx>>;

struct Report {
    states: usize,
    elapsed: Duration,
    violation: Option<(Inv, Vec<String>)>,
    /// Bits of [`Cov`]: the protocol's paths the exploration went through.
    coverage: u64,
    /// The most Jobs any state held.
    max_jobs: usize,
}

impl Report {
    fn covered(&self, c: Cov) -> bool {
        self.coverage & c.bit() != 0
    }
}

/// Breadth-first search over every interleaving. Stops at the first state violating an
/// invariant (only `want`, when given: states violating others are explored on), so the trace
/// is a shortest one.
fn explore(cfg: &Config, want: Option<Inv>) -> Report {
    let t = Instant::now();
    let s0 = canon(cfg, initial());
    let mut states = vec![s0];
    let mut parent = vec![u32::MAX];
    let mut seen = Visited::default();
    seen.insert(s0, 0);
    let mut coverage = 0;
    let mut max_jobs = 0;
    let mut out = Vec::new();
    let mut i = 0;
    while i < states.len() {
        let s = states[i];
        let v = violations(cfg, &s);
        let hit = match want {
            None => Inv::ALL.into_iter().find(|inv| v & inv.bit() != 0),
            Some(w) => (v & w.bit() != 0).then_some(w),
        };
        if let Some(inv) = hit {
            return Report {
                states: states.len(),
                elapsed: t.elapsed(),
                violation: Some((inv, trace(cfg, &states, &parent, i))),
                coverage,
                max_jobs,
            };
        }
        if cfg.backstop
            && s.jobs()
                .iter()
                .any(|j| j.resumed && !fence_accepts(&s, j.token))
        {
            coverage |= Cov::StaleRefused.bit();
        }
        if cfg.pods.is_some() {
            coverage |= pod_coverage(cfg, &s);
        }
        max_jobs = max_jobs.max(s.njobs as usize);
        successors(cfg, &s, false, &mut coverage, &mut out);
        for &(n, _) in &out {
            let n = canon(cfg, n);
            if let Entry::Vacant(e) = seen.entry(n) {
                e.insert(states.len() as u32);
                states.push(n);
                parent.push(i as u32);
            }
        }
        i += 1;
    }
    Report {
        states: states.len(),
        elapsed: t.elapsed(),
        violation: None,
        coverage,
        max_jobs,
    }
}

/// The paths of [`Cov`] about pods that state `s` shows.
fn pod_coverage(cfg: &Config, s: &State) -> u64 {
    let mut out = 0;
    for (u, job) in s.jobs().iter().enumerate() {
        let here = &job.pods[..job.npods as usize];
        if here.iter().any(|p| p.phase == Phase::Terminal && p.alive) {
            out |= Cov::ZombiePod.bit();
        }
        if here.iter().filter(|p| p.alive).count() > 1 {
            out |= Cov::TwoPodsAlive.bit();
        }
        // Pods are created only while no earlier one runs: a later pod beside a terminating
        // one was created while it was terminating.
        if here.len() > 1
            && here[..here.len() - 1]
                .iter()
                .any(|p| p.phase == Phase::Terminating)
        {
            out |= Cov::ReplacedWhileTerminating.bit();
        }
        for (i, p) in here.iter().enumerate() {
            if p.alive
                && p.begun != 0
                && s.newest != attempt_id(u, i)
                && s.newest_token() == Some(job.token)
            {
                out |= Cov::AttemptSuperseded.bit();
            }
        }
        if job.external && s.may_write(cfg, u) {
            out |= Cov::ExternalWrote.bit();
        }
    }
    out
}

/// The labels of the transitions from the initial state to `states[i]`.
fn trace(cfg: &Config, states: &[State], parent: &[u32], i: usize) -> Vec<String> {
    let mut path = vec![i];
    while parent[*path.last().unwrap()] != u32::MAX {
        path.push(parent[*path.last().unwrap()] as usize);
    }
    path.reverse();
    // Replayed on the states themselves (not their canonical forms), so that the actors' names
    // and the resourceVersions in the labels stay those of one execution.
    let mut out = vec!["start".to_string()];
    let mut now = initial();
    for &k in &path[1..] {
        let mut next = Vec::new();
        successors(cfg, &now, true, &mut 0, &mut next);
        let (n, label) = next
            .into_iter()
            .find(|(n, _)| canon(cfg, *n) == states[k])
            .expect("a transition to the next state");
        out.push(label);
        now = n;
    }
    out
}

fn show(cfg: &Config, want: Option<Inv>, r: &Report) {
    let covered: Vec<String> = Cov::ALL
        .iter()
        .filter(|c| r.covered(**c))
        .map(|c| format!("{c:?}"))
        .collect();
    let what = match &r.violation {
        None => format!(
            "no violation; at most {} Jobs; reached: {}",
            r.max_jobs,
            covered.join(" ")
        ),
        Some((inv, trace)) => format!(
            "{} ({} steps):\n    {}",
            inv.text(),
            trace.len() - 1,
            trace.join("\n    ")
        ),
    };
    let only = want
        .map(|w| format!(" looking for {w:?}"))
        .unwrap_or_default();
    eprintln!(
        "{cfg:?}{only}: {} states in {:.2?}; {what}",
        r.states, r.elapsed
    );
}

fn run(cfg: Config) -> Report {
    let r = explore(&cfg, None);
    show(&cfg, None, &r);
    r
}

/// A configuration of the protocol as specified. With the backstop, the fence rises once by
/// itself (so step 4's re-claim is reached) and an earlier incarnation's claim row may appear (so
/// Deduplicated is); without it, a foreign Job may appear (so step 7's other-token branches and
/// the sweeper meet a Job no claim made). The foreign Job is left out with the backstop: it
/// multiplies the states by four and meets no backstop step (steps 4 and the retirement read no
/// Jobs; steps 7 and the sweeper read no backstop).
fn cfg(policy: Policy, backstop: bool, prune: bool) -> Config {
    Config {
        policy,
        backstop,
        prune,
        bump: backstop,
        foreign: !backstop,
        foreign_row: backstop,
        pods: None,
        external: false,
        prepare: false,
        broken: Broken::None,
    }
}

/// A configuration with pods (and so the backstop): the Job's replacement policy, the workload's
/// fence, whether a terminating pod may be force-deleted on a partition while its process runs,
/// and whether a Job may be started by someone else (once). An earlier incarnation's claim row
/// is left out (Deduplicated meets no pod), and so is pruning (with external resumers it
/// multiplies the states by eleven, and reaches the gap that
/// `a_pending_claims_job_deleted_by_someone_else_is_run_again` shows); with external resumers
/// so is the fence's rise by itself (it multiplies the states by five; from a pod's side it
/// fences a token out as a retirement does, which the stops do).
fn pods(
    policy: Policy,
    replacement: Replacement,
    workload: Workload,
    partition: bool,
    external: bool,
) -> Config {
    Config {
        pods: Some(Pods {
            replacement,
            workload,
            partition,
        }),
        external,
        foreign_row: false,
        bump: !external,
        ..cfg(policy, true, false)
    }
}

/// A configuration with prepared runs (issue 33), with or without the backstop, as [`cfg`] makes
/// it but for an earlier incarnation's claim row (a period Deduplicated against it would read as
/// lost to preparation). With the backstop the fence rises once by itself: break-lock, whose
/// step 1b marks the prepared Job withdrawn first; without it a foreign Job may appear. `prune`:
/// finished Jobs that `active` does not reference may be deleted (history limits, or a user).
fn preparing(policy: Policy, backstop: bool, prune: bool) -> Config {
    Config {
        prepare: true,
        foreign_row: false,
        ..cfg(policy, backstop, prune)
    }
}

/// Explores `configs`, asserting that no invariant is violated and that the paths in `reached`
/// were gone through, and those of [`BACKSTOP`] with the backstop and [`FOREIGN`] without it.
/// Returns the paths gone through in any of them.
fn holds(configs: &[Config], reached: &[Cov]) -> u64 {
    let t = Instant::now();
    let mut total = 0;
    let mut union = 0;
    for c in configs {
        let r = run(*c);
        total += r.states;
        union |= r.coverage;
        assert!(r.violation.is_none(), "{c:?}: {:?}", r.violation);
        let more: &[Cov] = match (c.pods, c.backstop) {
            (Some(_), _) if c.bump => &BACKSTOP[..3],
            (Some(_), _) => &BACKSTOP[..2],
            (None, true) if !c.foreign_row => &BACKSTOP[..3],
            (None, true) => &BACKSTOP,
            (None, false) => &FOREIGN,
        };
        for cov in reached.iter().chain(more) {
            assert!(r.covered(*cov), "{c:?}: never reached {cov:?}");
        }
    }
    eprintln!("total {total} states in {:.2?}", t.elapsed());
    union
}

/// Paths every configuration goes through: a claim completed by another actor (adopting the
/// Job), a re-check that finds the claim gone, both ends of a lost confirm, a lost resume
/// repaired by step 1. (The sweeper finds something in some configurations only: a Job no claim
/// knows whose token is not above the status's needs its period's Job gone first.)
const EVERYWHERE: [Cov; 5] = [
    Cov::Adopted,
    Cov::RecheckFailed,
    Cov::LostConfirmResumed,
    Cov::LostConfirmDeleted,
    Cov::ResumeRepaired,
];

/// With the backstop: the fence refuses some run's write, tokens are retired, a stale token is
/// re-claimed, a period claimed before is Deduplicated.
const BACKSTOP: [Cov; 4] = [
    Cov::StaleRefused,
    Cov::Retired,
    Cov::Reclaimed,
    Cov::Deduplicated,
];

/// Without the backstop, a foreign Job under a period's name (an earlier incarnation's, a
/// user's): step 7 deletes it while it is suspended and nobody knows it, and records the period
/// as ForeignJob when it runs.
const FOREIGN: [Cov; 2] = [Cov::ForeignDeleted, Cov::ForeignRecorded];

/// Forbid with no Job deleted but by the controller (no pruning), with and without the
/// backstop: every invariant holds.
#[test]
fn claim_protocol_holds_when_jobs_are_not_pruned() {
    holds(
        &[
            cfg(Policy::Forbid, false, false),
            cfg(Policy::Forbid, true, false),
        ],
        &EVERYWHERE,
    );
}

/// Issue 16's window: a claimer paused after its re-check (step 5) while another replica
/// completes the claim, the Job runs, finishes and is deleted (Replace, history pruning, a user),
/// re-creates the period's Job with the claim's token: Kubernetes has no conditional create, so
/// this cannot be prevented, and the model reaches it ([`Cov::Recreated`]). The re-created Job
/// is suspended, and only a uid that a compare-and-swap confirmed is ever resumed, so it never
/// runs: its confirm loses and deletes it, or the sweeper does. Replace and pruning, with and
/// without the backstop: every invariant holds, also G1 over Job uids and the equal-token fence.
#[test]
fn a_stale_leader_never_runs_a_deleted_job_again() {
    let mut configs = vec![
        cfg(Policy::Forbid, false, true),
        cfg(Policy::Forbid, true, true),
    ];
    for backstop in [false, true] {
        for prune in [false, true] {
            configs.push(cfg(Policy::Replace, backstop, prune));
        }
    }
    let mut reached = EVERYWHERE.to_vec();
    reached.extend([Cov::Recreated, Cov::ResumeNotFound]);
    let union = holds(&configs, &reached);
    assert!(
        union & Cov::Swept.bit() != 0,
        "the sweeper never removed a Job"
    );
}

/// Paths every configuration with pods goes through: two pods of a Job run at once (one
/// deleted or evicted, its process running on).
const PODS: [Cov; 1] = [Cov::TwoPodsAlive];

/// Issue 31, F1: the pods of a run. With attempts registered and the 3-argument fence, at most one
/// attempt of a run writes at a time and none after a newer one began, whatever the Job's
/// replacement policy and also for a pod force-deleted on a partition while its process runs:
/// the attempt fence alone is enough.
#[test]
fn attempts_of_a_run_never_overlap() {
    use Replacement::{Failed, TerminatingOrFailed};
    let mut configs = Vec::new();
    for policy in [Policy::Forbid, Policy::Replace] {
        for replacement in [Failed, TerminatingOrFailed] {
            configs.push(pods(policy, replacement, Workload::Attempts, true, false));
        }
    }
    let mut reached = EVERYWHERE.to_vec();
    reached.extend(PODS);
    reached.extend([Cov::ZombiePod, Cov::AttemptSuperseded]);
    let union = holds(&configs, &reached);
    assert!(union & Cov::ReplacedWhileTerminating.bit() != 0);
}

/// The token-only fence (a workload that never registers) cannot tell two pods of one run
/// apart. It holds only while Kubernetes never runs two of them: `podReplacementPolicy: Failed`
/// and a pod that Kubernetes sees terminal has stopped (no force delete on a partition).
#[test]
fn token_only_fence_holds_with_failed_replacement_and_no_partition() {
    let configs = [Policy::Forbid, Policy::Replace]
        .map(|p| pods(p, Replacement::Failed, Workload::TokenOnly, false, false));
    holds(&configs, &EVERYWHERE);
}

/// F1, the bug issue 31 fixes, shown: with the token-only fence, two attempts of one run write
/// with `podReplacementPolicy: TerminatingOrFailed` (a replacement as soon as the old pod is
/// deleted or evicted, its process running on), and with `Failed` too once a terminating pod is
/// force-deleted on a partition (Kubernetes sees it terminal, its process runs on). These
/// configurations are expected to fail, with a shortest trace.
#[test]
fn token_only_fence_lets_two_attempts_write() {
    use Inv as I;
    use Replacement::{Failed, TerminatingOrFailed};
    let t = Instant::now();
    let table = [
        (TerminatingOrFailed, false),
        (TerminatingOrFailed, true),
        (Failed, true),
    ];
    for (replacement, partition) in table {
        let c = pods(
            Policy::Forbid,
            replacement,
            Workload::TokenOnly,
            partition,
            false,
        );
        for inv in [I::TwoAttemptsWrite, I::AttemptsOverlap] {
            let r = explore(&c, Some(inv));
            show(&c, Some(inv), &r);
            let (found, trace) = r.violation.expect("two attempts of a run must write");
            assert_eq!(found, inv);
            assert!(trace.len() > 1);
        }
    }
    eprintln!("the token-only fence's F1 shown in {:.2?}", t.elapsed());
}

/// Only the controller starts a run: a Job someone else unsuspends (or that comes back from
/// create not suspended) is stopped, its token retired first, then its period decided Failed,
/// then the Job deleted; its pods may have written before, but no other Job of its period
/// writes, nothing of it is accepted once its period is decided, it is never recorded as the
/// period's run, and no Job is resumed with its retired token. A stop cut short is finished by
/// the claim's completion: step 7 finds the claim's own Job started by someone else and stops
/// it ([`Cov::OwnJobStopped`]), step 4 finds the claim's own row retired and decides the period
/// without a Job ([`Cov::RetiredClaimDecided`]).
#[test]
fn a_job_started_by_someone_else_is_stopped() {
    let configs = [Policy::Forbid, Policy::Replace]
        .map(|p| pods(p, Replacement::Failed, Workload::Attempts, true, true));
    let mut reached = EVERYWHERE.to_vec();
    reached.extend(PODS);
    reached.extend([
        Cov::ExternalStopped,
        Cov::NotSuspendedAtCreate,
        Cov::ResumeFoundStarted,
        Cov::ExternalWrote,
        Cov::RetiredClaimDecided,
        Cov::OwnJobStopped,
    ]);
    holds(&configs, &reached);
}

/// What the stop's order cannot prevent: a pending claim's Job that someone else started (here a
/// webhook at create) and that is then deleted by someone other than the controller's stop (a
/// user; here the model's pruning of a finished Job, which stands for it) before any stop wrote
/// its decision leaves nothing in Kubernetes to stop, and the claim's completion creates, confirms
/// and resumes the period's Job again with the same token. If no stop retired the token, both
/// Jobs' writes are accepted ([`Inv::ExternallyStarted`]); if a stop retired it and was cut short
/// before its status write, the new Job runs with the retired token ([`Inv::ResumedRetired`]),
/// none of its writes accepted. These configurations are expected to fail, with a shortest trace.
#[test]
fn a_pending_claims_job_deleted_by_someone_else_is_run_again() {
    let t = Instant::now();
    for policy in [Policy::Forbid, Policy::Replace] {
        let c = Config {
            prune: true,
            ..pods(policy, Replacement::Failed, Workload::Attempts, true, true)
        };
        for inv in [Inv::ExternallyStarted, Inv::ResumedRetired] {
            let r = explore(&c, Some(inv));
            show(&c, Some(inv), &r);
            let (found, trace) = r.violation.expect("the deleted Job's claim must run again");
            assert_eq!(found, inv);
            assert!(trace.iter().any(|l| l.ends_with("is pruned")));
        }
    }
    eprintln!("the deleted Job's claim run again in {:.2?}", t.elapsed());
}

/// Paths every configuration with prepared runs goes through: the prepared Job resumed at its
/// instant, a withdrawal recorded, the period claimed again and created with a new token, a
/// late resume refused by its `released` test, a W1 that finds the Job resumed (promoted
/// instead), a lost W5 finished by the sweeper, a Job gone after its instant promoted, a
/// withdrawal that finds the Job gone after its instant stopped. (With the backstop,
/// break-lock's step 1b too.)
const PREPARED: [Cov; 8] = [
    Cov::PreparedResumed,
    Cov::PreparedWithdrawn,
    Cov::PreparedPeriodAgain,
    Cov::ResumeFoundWithdrawn,
    Cov::MarkFoundResumed,
    Cov::WithdrawnSwept,
    Cov::GonePromoted,
    Cov::WithdrawalFoundGone,
];

/// Issue 33: a run prepared ahead of its instant (its claim, backstop row, suspended Job and
/// `status.prepared` written, the cursor not moved) is resumed by one patch at its instant,
/// never before ([`Inv::ReleasedEarly`]), or withdrawn (W1 to W5) and its period decided as
/// without preparation: claimed again with a new token once its claim row is archived, never
/// lost ([`Inv::LostToPreparation`]); a Job marked withdrawn never runs ([`Inv::WithdrawnRan`]),
/// and G1, G3, fencing, G5 and G2 hold as without preparation. Forbid and Replace (a run is
/// prepared only with none active, P1), with a user's edit; with the backstop (and break-lock's
/// step 1b) and without it (a foreign Job under a period's name).
///
/// Finished Jobs are pruned (a user's delete, history limits): these are the configurations in
/// which the model found issue 33's gap, fixed in `src/`. A prepared Job resumed at its instant
/// whose promote was lost (its replica crashed, or its status write got a 409), then finished
/// and deleted, may have run: the judge asks first whether a missing Job's instant has come and
/// promotes it ([`Cov::GonePromoted`]), whatever changed since (the user's edit, P2, the
/// cursor); a withdrawal judged before the resume whose W1 then gets a 404, or whose re-read
/// finds the Job gone, stops there once the instant may have passed, and the next judge decides
/// ([`Cov::WithdrawalFoundGone`]). Its period never runs a second time ([`Inv::G1`]), and a
/// promoted Job that never ran would be [`Inv::G2Lost`]. The order before the fix,
/// [`Broken::WithdrawGoneJob`], is caught by G1, and so is each half of it alone
/// ([`Broken::JudgeGoneJobLate`], [`Broken::MarkGoneGoesOn`]). Pruning only adds transitions
/// (nothing else in the model reads it), so these explorations hold every execution without it.
#[test]
fn a_prepared_run_runs_at_its_instant_or_is_withdrawn() {
    let mut reached = EVERYWHERE.to_vec();
    reached.extend(PREPARED);
    for backstop in [false, true] {
        if backstop {
            reached.push(Cov::LockBrokeMarked);
        }
        let configs = [Policy::Forbid, Policy::Replace].map(|p| preparing(p, backstop, true));
        holds(&configs, &reached);
    }
}

/// The broken variants, each with the configuration and the invariants it is caught by: every
/// one of them is found, with a shortest trace, and every invariant is caught by some variant.
#[test]
fn broken_variants_are_caught() {
    use Broken as B;
    use Inv as I;
    use Policy::{Forbid, Replace};
    let attempts = pods(Forbid, Replacement::Failed, Workload::Attempts, true, false);
    let external = pods(Forbid, Replacement::Failed, Workload::Attempts, true, true);
    let pods_table: &[(Broken, Config, &[Inv])] = &[
        (
            B::NoAttemptCheck,
            attempts,
            &[I::AttemptsOverlap, I::TwoAttemptsWrite],
        ),
        (B::IgnoreExternalResume, external, &[I::ExternalAdopted]),
        (B::StopWithoutRetire, external, &[I::FenceRetired]),
        (
            B::DeleteBeforeRetire,
            external,
            &[I::ExternallyStarted, I::ResumedRetired],
        ),
        (B::DeleteBeforeRecord, external, &[I::ResumedRetired]),
    ];
    let prep = preparing(Forbid, true, false);
    let unlocked = Config {
        bump: false,
        ..prep
    };
    let pruned = preparing(Forbid, true, true);
    let prepared_table: &[(Broken, Config, &[Inv])] = &[
        (B::NoReleasedTest, prep, &[I::WithdrawnRan, I::G1]),
        // Without break-lock, the withdrawn mark is another replica's W1.
        (B::NoReleasedTest, unlocked, &[I::WithdrawnRan]),
        (B::PreparedInActive, prep, &[I::ReleasedEarly]),
        (B::WithdrawRecordFirst, prep, &[I::LostToPreparation]),
        (B::RetireBeforeMark, prep, &[I::ResumedRetired]),
        // Issue 33's gap, before the fix: a resumed prepared Job, its promote lost, gone.
        (B::WithdrawGoneJob, pruned, &[I::G1]),
        (B::JudgeGoneJobLate, pruned, &[I::G1]),
        (B::MarkGoneGoesOn, pruned, &[I::G1]),
    ];
    let table: &[(Broken, Policy, bool, bool, &[Inv])] = &[
        // Issue 16: the Job created running, re-created by a stale claimer after pruning.
        (
            B::OldProtocol,
            Forbid,
            false,
            true,
            &[I::G1, I::TokenRanTwice, I::G3, I::RetiredRan, I::G5Two],
        ),
        (B::OldProtocol, Forbid, true, true, &[I::G1, I::RetiredRan]),
        (B::OldProtocol, Replace, true, false, &[I::G1]),
        (B::NoRetirement, Forbid, true, false, &[I::FenceRetired]),
        (
            B::RetireAfterRecord,
            Forbid,
            true,
            false,
            &[I::FenceRetired],
        ),
        (
            B::ResumeOnLostConfirm,
            Forbid,
            true,
            true,
            &[I::G1, I::TokenRanTwice, I::RetiredRan],
        ),
        (B::ResumeOnLostConfirm, Replace, false, false, &[I::G1]),
        (
            B::BlindStatusWrite,
            Forbid,
            false,
            true,
            &[I::G1, I::G5Two, I::G2Lost],
        ),
        (B::BlindStatusWrite, Forbid, true, false, &[I::G5Two]),
        (B::CreateBeforeClaim, Replace, true, false, &[I::FenceOlder]),
        (
            B::RowWithoutFence,
            Replace,
            true,
            false,
            &[I::G5Fence, I::FenceOlder, I::FenceRetired],
        ),
        (B::ReplaceAfterResume, Replace, false, false, &[I::G5Two]),
        (B::SilentMiss, Forbid, false, false, &[I::G2Decided]),
        (B::NoResumeRepair, Forbid, false, false, &[I::G2Quiet]),
        (B::SweepIgnoresPending, Forbid, false, false, &[I::G2Lost]),
        (B::SweepUnbounded, Forbid, false, false, &[I::G2Lost]),
    ];
    let t = Instant::now();
    let mut fired = 0;
    let rows = table
        .iter()
        .map(|&(broken, policy, backstop, prune, invs)| {
            (broken, cfg(policy, backstop, prune), invs)
        });
    let more = pods_table.iter().chain(prepared_table).copied();
    for (broken, c, invs) in rows.chain(more) {
        let c = Config { broken, ..c };
        for &inv in invs {
            let r = explore(&c, Some(inv));
            show(&c, Some(inv), &r);
            let (found, trace) = r.violation.expect("the broken protocol must be caught");
            assert_eq!(found, inv);
            assert!(trace.len() > 1, "{broken:?}: {inv:?} with an empty trace");
            if matches!(
                broken,
                B::WithdrawGoneJob | B::JudgeGoneJobLate | B::MarkGoneGoesOn
            ) {
                // The gap: the prepared Job resumed at its instant, then gone (pruned).
                assert!(trace.iter().any(|l| l.contains("resumes prepared")));
                assert!(trace.iter().any(|l| l.ends_with("is pruned")));
            }
            fired |= inv.bit();
        }
    }
    for inv in Inv::ALL {
        assert!(
            fired & inv.bit() != 0,
            "no broken variant shows {inv:?} firing"
        );
    }
    eprintln!("all broken variants caught in {:.2?}", t.elapsed());
}
