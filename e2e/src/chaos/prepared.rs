//! The prepared-run rows (issue 33, docs/design/prepared-runs.md §6 "Chaos rows"): SingletonJobs
//! every 10 s with `prepareLeadSeconds: 6`, the PostgreSQL backstop and history limits 0, whose
//! runs are claimed, created suspended and confirmed ahead of their instants; each fault is timed
//! against such a prepared run, and the row checks, beyond the common columns, what became of
//! each period the fault met ([`check::check_decisions`]).
//!
//! - `prepared-leader-sigstop`: replica 0 leads, armed to SIGSTOP itself right before it sends a
//!   prepared run's resume (failpoint `resume-prepared`): it stops at the instant of `held`'s run,
//!   past the gate. From then its proxy holds what it sends (a network that delays its requests);
//!   it is continued just long enough to send the resume and stopped again, with `next`'s run
//!   prepared 5 s ahead, and kept stopped past its Lease and past `next`'s instant. `held` is
//!   suspended meanwhile; the new leader withdraws its run and stops itself right after marking
//!   the Job withdrawn (failpoint `withdraw-marked`, the other replicas armed), so the Job is still
//!   there, suspended and marked, when the proxy delivers the late resume. Only the resume's
//!   `released: "false"` test refuses it. A plain SIGSTOP at a moment of the harness's choosing
//!   cannot test that: the gate, checked right before each send, closes at the renew deadline by
//!   the monotonic clock, and a leader that finds its Lease lost aborts its in-flight reconciles
//!   at once, so a process stopped before its send sends nothing after it is continued (seen: it
//!   logged its exit before the reconcile stopped at the failpoint went on). The late request has
//!   to be one already written.
//! - `prepared-leader-sigkill`: the leader SIGKILLed 4 s before a prepared run's instant; the new
//!   leader resumes it at the instant (late by at most a failover) or withdraws it.
//! - `edit-before-instant`: 1.0 s before three instants (by this machine's clock, which is the
//!   API server's) the harness commits, in turn, `suspend: true` (with `catchUp: None`: the period
//!   is Skipped, reason Suspended), a schedule edit that drops the instant (never run), and a
//!   template edit (the run carries the new template; the prepared Job never runs). The leader,
//!   replica 0, sees what the API server pushes (its watches) 2 s late, through a proxy
//!   ([`crate::Proxy::delay_pushed`]) that answers its requests at once: at the instant its cache
//!   still shows the spec before the edit, and only the quorum read shortly before the resume
//!   (design §1.2's freshness check) makes the edit win.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use serde_json::json;
use singleton::api::RunRef;
use singleton::decide::reason;
use singleton::failpoint;

use super::check::{self, Decision, Expect, Expected, FaultWindow, PreparedFate, Proof};
use super::world::{Armed, SjDef, World};
use super::{CATCH_UP, FAILOVER_SLACK, Fault, LEASE, LEASE_WAIT, Mode, Outcome, RETRY};
use crate::observer::JobRecord;

/// The rows' schedules: every 10 s, at a phase each row chooses.
const PERIOD: i64 = 10;
/// `spec.prepareLeadSeconds` of every SingletonJob of these rows.
const LEAD_SECONDS: i64 = 6;
/// How late replica 0 of edit-before-instant sees what the API server pushes.
const WATCH_LAG: Duration = Duration::from_secs(2);
/// How long before its instant each edit of edit-before-instant is committed.
const EDIT_AHEAD: SignedDuration = SignedDuration::from_millis(1000);
/// The command of the template edit-before-instant's template edit puts in place.
const EDITED: &str = "echo edited $SINGLETON_FENCING_TOKEN";
/// How many instants a row tries before giving up on a run being prepared in time.
const TRIES: u32 = 3;

/// Reasons these rows' faults explain: a failover's catch-up, and `suspend` set on a SingletonJob
/// with `catchUp: None` (its period Skipped).
const SUSPENDED: &[&str] = &[
    reason::SUPERSEDED,
    reason::DEADLINE_EXCEEDED,
    reason::SUSPENDED,
];

/// prepared-leader-sigkill's kills.
fn kills(mode: Mode) -> usize {
    match mode {
        Mode::Short => 1,
        Mode::Full => 3,
    }
}

/// The longest failover docs/reliability.md promises.
fn failover_bound() -> Duration {
    LEASE + RETRY + FAILOVER_SLACK
}

/// What a prepared row must show beyond the common checks.
pub fn expect(fault: Fault, mode: Mode) -> Expect {
    let (reasons, min_due_in_fault, failover_max, min_failovers) = match fault {
        // held's instant (the stop) and next's (while stopped).
        Fault::PreparedLeaderSigstop => (SUSPENDED, 2, Some(failover_bound()), 1),
        Fault::PreparedLeaderSigkill => (
            CATCH_UP,
            kills(mode) as u64,
            Some(failover_bound()),
            kills(mode),
        ),
        // The suspended instant and the template-edited one (the dropped one is no period).
        _ => (SUSPENDED, 2, None, 0),
    };
    Expect {
        reasons,
        min_due_in_fault,
        failover_max,
        min_failovers,
        ..Expect::default()
    }
}

/// Runs a prepared row end to end.
pub async fn run(fault: Fault, mode: Mode) -> Result<Outcome> {
    match fault {
        Fault::PreparedLeaderSigstop => leader_sigstop(mode).await,
        Fault::PreparedLeaderSigkill => leader_sigkill(mode).await,
        Fault::EditBeforeInstant => edits(mode).await,
        f => bail!("{} is not a prepared row", f.name()),
    }
}

/// A SingletonJob of these rows: every 10 s at the phase of `instant`, prepared 6 s ahead,
/// with the backstop and history limits 0; `extra` spec lines.
fn prepared_sj(name: &str, instant: Timestamp, extra: &str) -> SjDef {
    let phase = instant.as_second().rem_euclid(PERIOD);
    SjDef::new(name, format!("{phase}/{PERIOD} * * * * *"))
        .extra(&format!("  prepareLeadSeconds: {LEAD_SECONDS}\n{extra}"))
}

/// The first whole second at or after `t`.
fn second_at_or_after(t: Timestamp) -> Timestamp {
    let s = t.as_second() + i64::from(t.subsec_nanosecond() > 0);
    Timestamp::from_second(s).unwrap_or(t)
}

fn secs(d: SignedDuration) -> f64 {
    d.as_secs_f64()
}

/// Supervises the replicas until `t` by this machine's clock (the API server's: it runs here),
/// to within a few milliseconds.
async fn until(w: &mut World, t: Timestamp) -> Result<()> {
    let left = |t: Timestamp| t.duration_since(Timestamp::now());
    let coarse = left(t) - SignedDuration::from_millis(150);
    if coarse.is_positive() {
        w.run_for(coarse.unsigned_abs()).await?;
    }
    let fine = left(t);
    if fine.is_positive() {
        tokio::time::sleep(fine.unsigned_abs()).await;
    }
    Ok(())
}

/// `sj`'s prepared run, as the API server has it now.
async fn prepared_of(w: &World, sj: &str) -> Result<Option<RunRef>> {
    Ok(w.env.get_sj(sj).await?.status.and_then(|s| s.prepared))
}

/// Whether `run` is the prepared run of `period`.
fn prepares(run: Option<&RunRef>, period: Timestamp) -> bool {
    run.is_some_and(|r| r.period.0 == period)
}

fn describe_run(run: Option<&RunRef>) -> String {
    match run {
        Some(r) => format!(
            "{} (token {}, resumeAt {})",
            r.job_name,
            r.token,
            r.resume_at
                .as_ref()
                .map_or("none".to_string(), |t| t.0.to_string())
        ),
        None => "none".to_string(),
    }
}

/// Commits `spec` (a merge patch of the SingletonJob's spec): when it was sent, and when the
/// API server's answer came (the commit lies between).
async fn edit(w: &World, sj: &str, spec: serde_json::Value) -> Result<(Timestamp, Timestamp)> {
    let sent = Timestamp::now();
    w.env
        .sjs()
        .patch(
            sj,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await?;
    Ok((sent, Timestamp::now()))
}

/// Waits (supervising, polling every 10 ms) until `pred` holds of the world, at most `timeout`;
/// whether it did.
async fn poll(w: &mut World, timeout: Duration, pred: impl Fn(&World) -> bool) -> Result<bool> {
    let end = Instant::now() + timeout;
    loop {
        w.tick().await?;
        if pred(w) {
            return Ok(true);
        }
        if Instant::now() > end {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The Jobs the watch saw of `sj`'s `period`.
fn jobs_of(w: &World, sj: &str, period: Timestamp) -> Vec<JobRecord> {
    w.observer
        .jobs()
        .into_iter()
        .filter(|j| j.sj.as_deref() == Some(sj) && j.period == Some(period))
        .collect()
}

/// The prepared Job of `sj`'s `period` as the watch sees it: created for its instant
/// (`singleton.dev/resume-at`), not let run, not withdrawn, still there.
fn prepared_job(w: &World, sj: &str, period: Timestamp) -> Option<JobRecord> {
    jobs_of(w, sj, period).into_iter().find(|j| {
        j.resume_at == Some(period) && !j.ran && j.withdrawn.is_none() && j.deleted.is_none()
    })
}

/// Waits (at most 60 s) until every SingletonJob ran a period after `healed`: when, if it did.
async fn recover(w: &mut World, fault: Fault, healed: Timestamp) -> Option<Timestamp> {
    let waited = w
        .wait(
            "every SingletonJob running again after the fault",
            Duration::from_secs(60),
            |w| Box::pin(async move { Ok(w.recovered_since(healed).await?.then_some(())) }),
        )
        .await;
    match waited {
        Ok(()) => Some(Timestamp::now()),
        Err(e) => {
            eprintln!("chaos: {}: {e:#}", fault.name());
            None
        }
    }
}

/// The row of `fault` from what the world shows between `from` and the settled end, with what
/// the harness measured and expects of the periods it acted on.
struct Course {
    fault: Fault,
    from: Timestamp,
    fault_from: Timestamp,
    healed: Timestamp,
    recovered: Option<Timestamp>,
    failovers: Vec<Duration>,
    proofs: Vec<Proof>,
    expected: Vec<(String, Timestamp, PreparedFate, Decision)>,
    /// Periods that are no instants of their SingletonJob any more (name, period).
    not_due: Vec<(String, Timestamp)>,
}

/// Settles, observes and judges the row.
async fn judge(mut w: World, mode: Mode, c: Course, began: Instant) -> Result<Outcome> {
    // The check's end (4 s before the settle's) comes after every period it judges.
    if let Some(last) = c.expected.iter().map(|e| e.1).max() {
        until(&mut w, last + SignedDuration::from_millis(1500)).await?;
    }
    let to = super::settle(&mut w, mode).await?;
    let mut obs = w.observe(c.from, to).await?;
    let ns = w.env.ns.clone();
    // A SingletonJob created after `from` has no periods before its creation.
    for sj in w.env.sjs().list(&Default::default()).await? {
        let key = format!("{ns}/{}", sj.metadata.name.clone().unwrap_or_default());
        if let Some(created) = sj.metadata.creation_timestamp.as_ref().map(|t| t.0) {
            for o in obs.sjs.iter_mut().filter(|o| o.key == key) {
                o.due.retain(|p| *p > created);
            }
        }
    }
    for (name, p) in &c.not_due {
        let key = format!("{ns}/{name}");
        for sj in obs.sjs.iter_mut().filter(|s| s.key == key) {
            sj.due.retain(|d| d != p);
        }
    }
    obs.failovers = c.failovers;
    obs.fault = Some(FaultWindow {
        from: c.fault_from,
        to: c.healed,
        recovered: c.recovered,
    });
    obs.settle = mode.settle();
    obs.proofs = c.proofs;
    let expect = expect(c.fault, mode);
    let window = c.healed.duration_since(c.fault_from).unsigned_abs();
    let mut row = check::evaluate(c.fault.name(), window, &expect, &obs);
    let expected: Vec<Expected> = c
        .expected
        .into_iter()
        .map(|(name, period, prepared, decision)| Expected {
            key: format!("{ns}/{name}"),
            period,
            prepared,
            decision,
        })
        .collect();
    row.details.extend(check::check_decisions(&obs, &expected));
    let decided: Vec<String> = expected
        .iter()
        .map(|e| format!("{} {}: {:?}, {:?}", e.key, e.period, e.prepared, e.decision))
        .collect();
    row.notes.push(format!(
        "periods checked as expected: {}",
        decided.join("; ")
    ));
    Ok(Outcome::judge(row, expect, began, w.dump()).await)
}

/// The failpoints environment arming `point` to stop the process.
fn arm(point: &str) -> Vec<(String, String)> {
    vec![("SINGLETON_FAILPOINTS".to_string(), format!("{point}=stop"))]
}

/// prepared-leader-sigstop (module docs).
async fn leader_sigstop(mode: Mode) -> Result<Outcome> {
    let began = Instant::now();
    let fault = Fault::PreparedLeaderSigstop;
    let mut w = sigstop_world(fault).await?;
    let from = Timestamp::now();
    let r = held_prepared(&mut w, from).await?;
    // `next`: created now, so that its first instant is 5 s after held's (replica 0's first
    // prepared resume is held's), prepared from 1 s before held's instant.
    let r_next = r + SignedDuration::from_secs(5);
    w.add_sjs(vec![prepared_sj("next", r_next, "")]).await?;
    let idx0 = w.process(0);
    let mut s = Sigstop {
        w,
        r,
        r_next,
        idx0,
        proofs: Vec::new(),
    };
    let t0 = s.stops_at_resume().await?;
    s.sends_resume().await?;
    s.suspends_held().await?;
    let (x, idx_x, took) = s.withdrawn_by_new_leader(t0).await?;
    s.delivers_late_resume().await?;
    s.continues(x, idx_x).await?;
    let Sigstop { mut w, proofs, .. } = s;
    let healed = Timestamp::now();
    // held resumes its schedule once its suspended period is decided.
    unsuspend_once_decided(&mut w, fault, "held", r).await?;
    let recovered = recover(&mut w, fault, healed).await;
    // next was let run by a leader once one could: within a failover of the end of the fault.
    let late = healed.duration_since(r_next).max(SignedDuration::ZERO);
    let within = late.unsigned_abs() + failover_bound();
    let course = Course {
        fault,
        from,
        fault_from: r,
        healed,
        recovered,
        failovers: vec![took],
        proofs,
        expected: vec![
            (
                "held".into(),
                r,
                PreparedFate::Withdrawn("Suspended"),
                Decision::Recorded {
                    outcome: "Skipped",
                    reason: reason::SUSPENDED,
                },
            ),
            (
                "next".into(),
                r_next,
                PreparedFate::Resumed,
                Decision::RanWithin { within },
            ),
        ],
        not_due: Vec::new(),
    };
    judge(w, mode, course, began).await
}

/// prepared-leader-sigstop's world: replica 0 armed to stop at its first prepared resume, the
/// other two at their first two withdrawal marks, all behind the proxy; replica 0 leading.
async fn sigstop_world(fault: Fault) -> Result<World> {
    let armed = Armed {
        envs: vec![
            arm(failpoint::RESUME_PREPARED),
            arm(failpoint::WITHDRAW_MARKED),
            arm(failpoint::WITHDRAW_MARKED),
        ],
        shaped: true,
    };
    let mut w = World::empty_armed(&format!("chaos-{}", fault.name()), armed).await?;
    w.wait_leader(None, Instant::now(), LEASE_WAIT).await?;
    if !w.make_leader(0, 8).await? {
        bail!("replica 0 (armed) never took the Lease\n{}", w.dump().await);
    }
    Ok(w)
}

/// Creates `held`, its first instant 7 s after `from`, and waits for an instant of it whose run
/// is prepared 4.5 s ahead (at most [`TRIES`]): that instant.
async fn held_prepared(w: &mut World, from: Timestamp) -> Result<Timestamp> {
    // `held`: its first instant 7 s ahead, prepared from 6 s before it.
    let mut r = second_at_or_after(from + SignedDuration::from_secs(7));
    w.add_sjs(vec![prepared_sj("held", r, "  catchUp: None\n")])
        .await?;
    let mut tries = 1;
    loop {
        until(w, r - SignedDuration::from_millis(4500)).await?;
        if prepares(prepared_of(w, "held").await?.as_ref(), r) {
            return Ok(r);
        }
        // Not prepared in time: it runs without preparation, and replica 0 resumes nothing
        // prepared; the next instant is prepared 6 s ahead.
        if tries == TRIES {
            bail!(
                "held's run was not prepared 4.5 s before {TRIES} instants in a row\n{}",
                w.dump().await
            );
        }
        tries += 1;
        r += SignedDuration::from_secs(PERIOD);
    }
}

/// prepared-leader-sigstop under way: the world, `held`'s instant `r` and `next`'s `r_next`,
/// replica 0's process and the evidence gathered so far.
struct Sigstop {
    w: World,
    r: Timestamp,
    r_next: Timestamp,
    idx0: usize,
    proofs: Vec<Proof>,
}

impl Sigstop {
    /// Waits for replica 0 to stop itself at held's resume, and proves it stopped at the
    /// failpoint; when it was seen stopped.
    async fn stops_at_resume(&mut self) -> Result<Instant> {
        let (w, r, idx0) = (&mut self.w, self.r, self.idx0);
        let stop_wait = r.duration_since(Timestamp::now()).unsigned_abs() + Duration::from_secs(5);
        if !poll(w, stop_wait, |w| w.env.controller_stopped(idx0)).await? {
            bail!(
                "replica 0 did not stop itself at held's instant {r}\n{}",
                w.dump().await
            );
        }
        let t0 = Instant::now();
        let log = w.env.controller_log(idx0);
        let at_point = log.lines().any(|l| {
            l.contains("failpoint: stopping the process") && l.contains(failpoint::RESUME_PREPARED)
        });
        self.proofs.push(Proof::new(
            at_point,
            format!(
                "replica 0 (process {idx0}) led and stopped itself (SIGSTOP) right before sending the resume of held's prepared run for {r}, {:.2} s after it (failpoint {} in its log: {at_point})",
                secs(Timestamp::now().duration_since(r)),
                failpoint::RESUME_PREPARED
            ),
        ));
        Ok(t0)
    }

    /// Continues replica 0 behind a network that holds what it sends, just long enough to send
    /// held's resume, and stops it again; proves it sent, and that next's run was prepared then.
    async fn sends_resume(&mut self) -> Result<()> {
        let (w, r, r_next, idx0) = (&mut self.w, self.r, self.r_next, self.idx0);
        // From here a network holds what it sends; it goes on just long enough to send the
        // resume (nothing is checked between the failpoint and the send) and is stopped again.
        let Some(held_before) = w.proxy.as_ref().map(|p| {
            p.hold_requests(true);
            p.held_requests()
        }) else {
            bail!("replica 0 has no proxy");
        };
        w.signal(0, "CONT").await?;
        let sent = poll(w, Duration::from_secs(2), |w| {
            w.env.controller_log(idx0).contains("failpoint: continued")
                && w.proxy
                    .as_ref()
                    .is_some_and(|p| p.held_requests() > held_before)
        })
        .await?;
        // The fault's own length: what follows the log line (the request's bytes) gets written.
        tokio::time::sleep(Duration::from_millis(100)).await;
        w.signal(0, "STOP").await?;
        let stopped_at = Timestamp::now();
        let held_chunks = w.proxy.as_ref().map_or(0, |p| p.held_requests()) - held_before;
        self.proofs.push(Proof::new(
            sent,
            format!(
                "continued, it went on from the failpoint and sent {held_chunks} chunk(s), held by the network ({sent}); stopped again {:.2} s after held's instant",
                secs(stopped_at.duration_since(r))
            ),
        ));
        let next_run = prepared_of(w, "next").await?;
        let ahead = r_next.duration_since(stopped_at);
        self.proofs.push(Proof::new(
            prepares(next_run.as_ref(), r_next) && ahead >= SignedDuration::from_secs(2),
            format!(
                "when it was stopped, next's run for {r_next} was prepared ({}), {:.1} s before its instant",
                describe_run(next_run.as_ref()),
                secs(ahead)
            ),
        ));
        Ok(())
    }

    /// Suspends held while replica 0 is stopped, before anyone else leads, and proves it.
    async fn suspends_held(&mut self) -> Result<()> {
        let (_, suspended) = edit(&self.w, "held", json!({ "suspend": true })).await?;
        let holder = self.w.leader().await?;
        self.proofs.push(Proof::new(
            holder == Some(0) && self.w.env.controller_stopped(self.idx0),
            format!(
                "held was suspended {:.1} s after its instant, replica 0 still stopped and holding the Lease ({holder:?})",
                secs(suspended.duration_since(self.r))
            ),
        ));
        Ok(())
    }

    /// Waits for a new leader to take the Lease (counted from `t0`), mark held's run withdrawn
    /// and stop itself after the mark, then keeps replica 0 stopped past next's instant; proves
    /// it. The new leader's slot and process, and how long its takeover took.
    async fn withdrawn_by_new_leader(&mut self, t0: Instant) -> Result<(usize, usize, Duration)> {
        let (w, r, r_next, idx0) = (&mut self.w, self.r, self.r_next, self.idx0);
        let (x, took) = w.wait_leader(Some(0), t0, LEASE_WAIT).await?;
        // The new leader withdraws held's run: it stops itself right after the mark (W1), so
        // the Job is marked withdrawn, suspended and still there when the late resume arrives.
        let idx_x = w.process(x);
        let marked = poll(w, Duration::from_secs(20), |w| {
            w.env.controller_stopped(idx_x)
                && jobs_of(w, "held", r)
                    .iter()
                    .any(|j| j.withdrawn.is_some() && j.deleted.is_none())
        })
        .await?;
        // Stopped past its Lease (taken over above) and past next's instant.
        until(w, r_next + SignedDuration::from_millis(500)).await?;
        let still = w.process(0) == idx0 && w.env.controller_stopped(idx0);
        let waiting = jobs_of(w, "held", r)
            .iter()
            .any(|j| j.withdrawn.is_some() && j.deleted.is_none() && !j.ran);
        self.proofs.push(Proof::new(
            marked && still && waiting && w.env.controller_stopped(idx_x),
            format!(
                "replica {x} took the Lease {:.1} s after the stop, marked held's prepared Job withdrawn and stopped itself after the mark (failpoint {}: {marked}); {:.1} s past next's instant replica 0 was still stopped ({still}) and the withdrawn Job still there, suspended ({waiting})",
                took.as_secs_f64(),
                failpoint::WITHDRAW_MARKED,
                secs(Timestamp::now().duration_since(r_next)),
            ),
        ));
        Ok((x, idx_x, took))
    }

    /// Lets the network deliver what replica 0 sent: its resume reaches the API server now,
    /// after the withdrawal's mark; proves it was answered.
    async fn delivers_late_resume(&mut self) -> Result<()> {
        let w = &mut self.w;
        if let Some(p) = &w.proxy {
            p.hold_requests(false);
        }
        let answered = poll(w, Duration::from_secs(5), |w| {
            w.proxy.as_ref().is_some_and(|p| {
                let (held, answered) = p.held_answered();
                held > 0 && answered == held
            })
        })
        .await?;
        let (held_conns, answered_conns) = w.proxy.as_ref().map_or((0, 0), |p| p.held_answered());
        self.proofs.push(Proof::new(
            answered,
            format!(
                "released {:.1} s after next's instant, what replica 0 sent reached the API server: answered on {answered_conns} of the {held_conns} connection(s) it was held on",
                secs(Timestamp::now().duration_since(self.r_next))
            ),
        ));
        Ok(())
    }

    /// Continues the new leader (slot `x`, if still process `idx_x`), which goes on from its
    /// mark, and replica 0, which finds its Lease lost and exits; disarms every slot and proves
    /// replica 0 exited.
    async fn continues(&mut self, x: usize, idx_x: usize) -> Result<()> {
        let (w, idx0) = (&mut self.w, self.idx0);
        if w.process(x) == idx_x {
            w.signal(x, "CONT").await?;
        }
        w.signal(0, "CONT").await?;
        for slot in 0..super::world::REPLICAS {
            w.disarm(slot);
        }
        let exited = w
            .wait("the stopped leader's exit", Duration::from_secs(15), |w| {
                Box::pin(async move { Ok(w.exited(0, idx0).then_some(())) })
            })
            .await
            .is_ok();
        self.proofs.push(Proof::new(
            exited,
            format!("continued, replica 0 exited within 15 s ({exited})"),
        ));
        Ok(())
    }
}

/// Waits (at most 20 s; a timeout is only logged) until `sj`'s suspended period `p` is decided,
/// then lifts its suspend, so that it resumes its schedule.
async fn unsuspend_once_decided(
    w: &mut World,
    fault: Fault,
    sj: &'static str,
    p: Timestamp,
) -> Result<()> {
    let decided = w
        .wait(
            &format!("{sj}'s suspended period decided"),
            Duration::from_secs(20),
            |w| {
                Box::pin(async move {
                    let status = w.env.get_sj(sj).await?.status.unwrap_or_default();
                    Ok(status
                        .decided_through
                        .is_some_and(|d| d.0 >= p)
                        .then_some(()))
                })
            },
        )
        .await;
    if let Err(e) = decided {
        eprintln!("chaos: {}: {e:#}", fault.name());
    }
    edit(w, sj, json!({ "suspend": false })).await?;
    Ok(())
}

/// prepared-leader-sigkill (module docs).
async fn leader_sigkill(mode: Mode) -> Result<Outcome> {
    let began = Instant::now();
    let fault = Fault::PreparedLeaderSigkill;
    let mut w = World::empty_armed(&format!("chaos-{}", fault.name()), Armed::default()).await?;
    w.wait_leader(None, Instant::now(), LEASE_WAIT).await?;
    let from = Timestamp::now();
    let mut r = second_at_or_after(from + SignedDuration::from_secs(8));
    w.add_sjs(vec![
        prepared_sj("a", r, ""),
        prepared_sj("b", r + SignedDuration::from_secs(5), ""),
    ])
    .await?;
    let mut k = Kills::default();
    for _ in 0..kills(mode) {
        w.wait_running(LEASE_WAIT).await?;
        let job = a_prepared(&mut w, &mut r).await?;
        k.kill_leader(&mut w, r, job).await?;
        r += SignedDuration::from_secs(PERIOD);
    }
    let healed = Timestamp::now();
    k.proofs.push(killed_by_sigkill(&mut w, &k.killed));
    let recovered = recover(&mut w, fault, healed).await;
    let course = Course {
        fault,
        from,
        fault_from: k.fault_from.unwrap_or(healed),
        healed,
        recovered,
        failovers: k.failovers,
        proofs: k.proofs,
        expected: k.expected,
        not_due: Vec::new(),
    };
    judge(w, mode, course, began).await
}

/// Waits, from 4 s before a's instant `r`, for its run to be prepared, at most until 2.5 s before
/// it; if it is not, tries the next instant (moving `r` on), at most [`TRIES`] instants. The
/// prepared Job, if the last instant tried had one.
async fn a_prepared(w: &mut World, r: &mut Timestamp) -> Result<Option<JobRecord>> {
    // a's run for r prepared, killed 4 s before r: the new leader takes over about when it
    // falls due. Not prepared 2.5 s before r: the next instant.
    // Prepared: its Job created suspended for its instant (`singleton.dev/resume-at`), not
    // let run, as the watch sees it.
    let mut tries = 1;
    loop {
        until(w, *r - SignedDuration::from_secs(4)).await?;
        let end = *r - SignedDuration::from_millis(2500);
        let mut job = prepared_job(w, "a", *r);
        while job.is_none() && Timestamp::now() < end {
            w.run_for(Duration::from_millis(50)).await?;
            job = prepared_job(w, "a", *r);
        }
        // The last try kills anyway: the proof below fails, and the check still judges
        // what ran (a run let run ahead of its instant, say).
        if job.is_some() || tries == TRIES {
            return Ok(job);
        }
        tries += 1;
        *r += SignedDuration::from_secs(PERIOD);
    }
}

/// What prepared-leader-sigkill's kills gathered: the evidence, the failovers, the periods put
/// in doubt, the processes killed and when the first kill was.
#[derive(Default)]
struct Kills {
    proofs: Vec<Proof>,
    failovers: Vec<Duration>,
    expected: Vec<(String, Timestamp, PreparedFate, Decision)>,
    killed: Vec<usize>,
    fault_from: Option<Timestamp>,
}

impl Kills {
    /// SIGKILLs the leader with a's run for `r` prepared (`job`, as the watch saw it), proves
    /// it, waits for the takeover and until just past `r`, and expects a's period `r` run within
    /// a failover.
    async fn kill_leader(
        &mut self,
        w: &mut World,
        r: Timestamp,
        job: Option<JobRecord>,
    ) -> Result<()> {
        let run = prepared_of(w, "a").await?;
        let (leader, _) = w.wait_leader(None, Instant::now(), LEASE_WAIT).await?;
        let idx = w.process(leader);
        w.signal(leader, "KILL").await?;
        let t0 = Instant::now();
        let killed_at = Timestamp::now();
        self.fault_from.get_or_insert(killed_at);
        let ahead = r.duration_since(killed_at);
        let prepared = match &job {
            Some(j) => format!(
                "Job {} (token {:?}) created {:?}, suspended",
                j.name,
                j.token,
                j.created.map(|t| t.to_string())
            ),
            None => format!("no Job of it waiting suspended ({TRIES} instants tried)"),
        };
        self.proofs.push(Proof::new(
            job.is_some() && ahead >= SignedDuration::from_secs(2),
            format!(
                "replica {leader} (process {idx}) led and was SIGKILLed {:.1} s before a's instant {r}, its run prepared: {prepared}; status.prepared {}",
                secs(ahead),
                describe_run(run.as_ref())
            ),
        ));
        let (_, took) = w.wait_leader(Some(leader), t0, LEASE_WAIT).await?;
        self.failovers.push(took);
        self.killed.push(idx);
        // The fault lasts until the instant it put in doubt: the takeover may come before it.
        until(w, r + SignedDuration::from_millis(500)).await?;
        self.expected.push((
            "a".to_string(),
            r,
            PreparedFate::ResumedOrWithdrawn,
            Decision::RanWithin {
                within: failover_bound(),
            },
        ));
        Ok(())
    }
}

/// The evidence that each of the `killed` processes ended by SIGKILL.
fn killed_by_sigkill(w: &mut World, killed: &[usize]) -> Proof {
    let by_kill = killed
        .iter()
        .filter(|idx| {
            use std::os::unix::process::ExitStatusExt as _;
            matches!(w.env.controller_exit(**idx), Ok(Some(s)) if s.signal() == Some(9))
        })
        .count();
    Proof::new(
        by_kill == killed.len(),
        format!(
            "{by_kill} of the {} leaders killed ended by SIGKILL",
            killed.len()
        ),
    )
}

/// An edit of edit-before-instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Edit {
    /// `suspend: true` (its SingletonJob has `catchUp: None`).
    Suspend,
    /// A schedule without the instant: every 20 s, 10 s off it.
    Schedule,
    /// The Job template's command.
    Template,
}

impl Edit {
    fn sj(self) -> &'static str {
        match self {
            Edit::Suspend => "s",
            Edit::Schedule => "c",
            Edit::Template => "t",
        }
    }

    /// Its patch of the spec, for the instant `r`.
    fn spec(self, r: Timestamp) -> serde_json::Value {
        match self {
            Edit::Suspend => json!({ "suspend": true }),
            Edit::Schedule => json!({ "schedule": dropping(r) }),
            Edit::Template => {
                json!({ "jobTemplate": { "spec": { "backoffLimit": 0, "template": { "spec": {
                "restartPolicy": "Never",
                "containers": [{ "name": "work", "image": "busybox", "command": ["sh", "-c", EDITED] }],
            } } } } })
            }
        }
    }

    /// What the prepared run becomes, and how its period must be decided.
    fn expected(self) -> (PreparedFate, Decision) {
        match self {
            Edit::Suspend => (
                PreparedFate::Withdrawn("Suspended"),
                Decision::Recorded {
                    outcome: "Skipped",
                    reason: reason::SUSPENDED,
                },
            ),
            Edit::Schedule => (
                PreparedFate::Withdrawn("ScheduleChanged"),
                Decision::NeverRun,
            ),
            Edit::Template => (
                PreparedFate::Withdrawn("SpecChanged"),
                Decision::RanWith {
                    command: format!("sh -c {EDITED}"),
                },
            ),
        }
    }
}

/// A schedule every 20 s whose instants are 10 s off `r`'s: every other instant of the
/// 10 s schedule, without `r`.
fn dropping(r: Timestamp) -> String {
    format!("{}/20 * * * * *", (r.as_second() + 10).rem_euclid(20))
}

/// edit-before-instant (module docs).
async fn edits(mode: Mode) -> Result<Outcome> {
    let began = Instant::now();
    let fault = Fault::EditBeforeInstant;
    let mut w = edits_world(fault).await?;
    let from = Timestamp::now();
    let r = second_at_or_after(from + SignedDuration::from_secs(9));
    let two = SignedDuration::from_secs(2);
    let mut plan = vec![
        (Edit::Suspend, r, 1),
        (Edit::Schedule, r + two, 1),
        (Edit::Template, r + two * 2, 1),
    ];
    w.add_sjs(vec![
        prepared_sj("s", r, "  catchUp: None\n"),
        prepared_sj("c", r + two, ""),
        prepared_sj("t", r + two * 2, ""),
    ])
    .await?;
    let fault_from = r - EDIT_AHEAD;
    let mut done = Edited {
        proofs: Vec::new(),
        expected: Vec::new(),
        not_due: Vec::new(),
        suspended: None,
        last: r,
    };
    while !plan.is_empty() {
        plan.sort_by_key(|(_, at, _)| *at);
        let (what, at, tries) = plan.remove(0);
        until(&mut w, at - EDIT_AHEAD).await?;
        let run = prepared_of(&w, what.sj()).await?;
        if !prepares(run.as_ref(), at) && tries < TRIES {
            // Not prepared in time: the same edit before its next instant.
            plan.push((what, at + SignedDuration::from_secs(PERIOD), tries + 1));
            continue;
        }
        done.commit(&w, what, at, run).await?;
    }
    // Past the last edited instant, by more than the watch lag: its decision was made.
    until(
        &mut w,
        done.last + SignedDuration::try_from(WATCH_LAG)? + SignedDuration::from_millis(500),
    )
    .await?;
    let delayed = w.proxy.as_ref().map_or(0, |p| p.delayed());
    if let Some(p) = &w.proxy {
        p.delay_pushed(None);
    }
    let healed = Timestamp::now();
    // s resumes its schedule once its suspended period is decided.
    if let Some(p) = done.suspended {
        unsuspend_once_decided(&mut w, fault, "s", p).await?;
    }
    done.proofs.push(Proof::new(
        delayed > 0,
        format!(
            "replica 0 saw what the API server pushed {} s late ({delayed} chunks delayed by the proxy)",
            WATCH_LAG.as_secs_f64()
        ),
    ));
    let recovered = recover(&mut w, fault, healed).await;
    let course = Course {
        fault,
        from,
        fault_from,
        healed,
        recovered,
        failovers: Vec::new(),
        proofs: done.proofs,
        expected: done.expected,
        not_due: done.not_due,
    };
    judge(w, mode, course, began).await
}

/// edit-before-instant's world: replica 0 behind the proxy and leading, the proxy delaying what
/// the API server pushes to it by [`WATCH_LAG`].
async fn edits_world(fault: Fault) -> Result<World> {
    let armed = Armed {
        envs: Vec::new(),
        shaped: true,
    };
    let mut w = World::empty_armed(&format!("chaos-{}", fault.name()), armed).await?;
    w.wait_leader(None, Instant::now(), LEASE_WAIT).await?;
    if !w.make_leader(0, 8).await? {
        bail!(
            "replica 0 (behind the proxy) never took the Lease\n{}",
            w.dump().await
        );
    }
    if let Some(p) = &w.proxy {
        p.delay_pushed(Some(WATCH_LAG));
    }
    Ok(w)
}

/// What edit-before-instant's edits gathered: the evidence, the periods they decide, the
/// periods the schedule edit dropped (name, period), the suspended instant and the last instant
/// edited.
struct Edited {
    proofs: Vec<Proof>,
    expected: Vec<(String, Timestamp, PreparedFate, Decision)>,
    not_due: Vec<(String, Timestamp)>,
    suspended: Option<Timestamp>,
    last: Timestamp,
}

impl Edited {
    /// Commits `what` before its instant `at` (whose prepared run, read just before, is `run`),
    /// proves it was committed in time with the run prepared and replica 0 leading, and records
    /// what must become of the period.
    async fn commit(
        &mut self,
        w: &World,
        what: Edit,
        at: Timestamp,
        run: Option<RunRef>,
    ) -> Result<()> {
        let leader = w.leader().await?;
        let (sent, answered) = edit(w, what.sj(), what.spec(at)).await?;
        let (before_sent, before_answer) = (at.duration_since(sent), at.duration_since(answered));
        self.proofs.push(Proof::new(
            prepares(run.as_ref(), at)
                && leader == Some(0)
                && before_answer >= SignedDuration::from_millis(500)
                && before_sent <= SignedDuration::from_millis(1500),
            format!(
                "{what:?} of {} committed {:.3} to {:.3} s before its instant {at}, its run prepared ({}), replica 0 leading ({leader:?})",
                what.sj(),
                secs(before_answer),
                secs(before_sent),
                describe_run(run.as_ref()),
            ),
        ));
        let (prepared, decision) = what.expected();
        self.expected
            .push((what.sj().to_string(), at, prepared, decision));
        match what {
            Edit::Suspend => self.suspended = Some(at),
            Edit::Schedule => self.not_due.extend(dropped_after(at)),
            Edit::Template => {}
        }
        self.last = self.last.max(at);
        Ok(())
    }
}

/// c's instants of the 10 s schedule in the 120 s from `at` (its schedule edit) that the new
/// schedule ([`dropping`]) does not have: they are no periods.
fn dropped_after(at: Timestamp) -> Vec<(String, Timestamp)> {
    let keep = (at.as_second() + 10).rem_euclid(20);
    let mut out = Vec::new();
    let mut p = at;
    while p < at + SignedDuration::from_secs(120) {
        if p.as_second().rem_euclid(20) != keep {
            out.push(("c".to_string(), p));
        }
        p += SignedDuration::from_secs(PERIOD);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn the_schedules_fall_on_the_instants_chosen() {
        // 1_800_000_000 is at second 0 of its minute.
        assert_eq!(prepared_sj("x", t(13), "").schedule, "3/10 * * * * *");
        assert_eq!(prepared_sj("x", t(40), "").schedule, "0/10 * * * * *");
        assert!(
            prepared_sj("x", t(0), "  catchUp: None\n")
                .extra
                .contains("  prepareLeadSeconds: 6\n  catchUp: None\n")
        );
        // Every 20 s, 10 s off the instant: never the instant itself.
        assert_eq!(dropping(t(13)), "3/20 * * * * *");
        assert_eq!(dropping(t(3)), "13/20 * * * * *");
        assert_eq!(
            second_at_or_after(t(4) + SignedDuration::from_millis(1)),
            t(5)
        );
        assert_eq!(second_at_or_after(t(4)), t(4));
    }
}
