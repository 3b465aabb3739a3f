//! Prepared runs (issue 33, docs/design/prepared-runs.md) in the model: `src/run/prepared.rs`,
//! break-lock's step 1b, and the environment that prepares a run and edits its SingletonJob. See
//! the model's module doc ("Prepared runs") for what is modelled and what is simplified.

use super::*;

/// A withdrawal's steps (design 3.3), each one atomic transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WStep {
    /// W1: the Job marked `released: withdrawn` by a patch testing uid and `released ==
    /// "false"` (`kube_io::withdraw_job`). 404: nothing to mark; go on before the instant, stop
    /// (back to idle, the next judge decides) once it may have passed.
    Mark,
    /// W1's test failed: the Job is read. Resumed (the resume won): promote instead; marked by
    /// another replica: go on; gone: as W1's 404.
    Reread,
    /// W2+W3: one backstop transaction moving the claim row of (period, token) to the archive
    /// (the period may be claimed again) and retiring the token.
    Archive,
    /// W4: a CAS on the judge's resourceVersion clearing `prepared` (the cursor unmoved).
    Record,
    /// W5: the Job deleted by uid.
    Delete,
}

/// The withdrawal's order: W1, W2+W3, W4, W5, or a broken one.
fn order(cfg: &Config) -> [WStep; 4] {
    use WStep::{Archive, Delete, Mark, Record};
    match cfg.broken {
        Broken::WithdrawRecordFirst => [Mark, Record, Archive, Delete],
        Broken::RetireBeforeMark => [Archive, Mark, Record, Delete],
        _ => [Mark, Archive, Record, Delete],
    }
}

/// The withdrawal's step after `done` (the first for `None`), W1 left out once `marked`.
fn after(cfg: &Config, done: Option<WStep>, marked: bool) -> Option<WStep> {
    let order = order(cfg);
    let from = match done {
        None => 0,
        Some(WStep::Reread) => order.iter().position(|&w| w == WStep::Mark).unwrap() + 1,
        Some(d) => order.iter().position(|&w| w == d).unwrap() + 1,
    };
    order[from..]
        .iter()
        .copied()
        .find(|&w| !(marked && w == WStep::Mark))
}

/// The actor's state after withdrawal step `done` (or at its start): the next step, or idle.
fn next(cfg: &Config, rv: u16, base: Status, uid: u8, done: Option<WStep>, marked: bool) -> Pc {
    match after(cfg, done, marked) {
        Some(step) => Pc::Withdraw {
            rv,
            base,
            uid,
            step,
            marked,
        },
        None => Pc::Idle,
    }
}

/// Whether the judge asks P2 and the basis before whether a missing Job may have run (the order
/// before the fix): [`Broken::WithdrawGoneJob`] and [`Broken::JudgeGoneJobLate`].
fn judge_gone_late(cfg: &Config) -> bool {
    matches!(
        cfg.broken,
        Broken::WithdrawGoneJob | Broken::JudgeGoneJobLate
    )
}

/// Whether a withdrawal whose W1 gets a 404, or whose re-read finds the Job gone, goes on to W2
/// also past the instant (before the fix): [`Broken::WithdrawGoneJob`] and
/// [`Broken::MarkGoneGoesOn`].
fn mark_gone_goes_on(cfg: &Config) -> bool {
    matches!(cfg.broken, Broken::WithdrawGoneJob | Broken::MarkGoneGoesOn)
}

/// The judge of step 1 for a reader of `s` whose status names prepared run `uid`
/// (`decide::prepare::judge` with the Job's mark, then `run::prepared::settle`): Promote, the
/// withdrawal (from W2 on once the Job is marked or gone), idle before the instant (Keep), or
/// RESUME-PREPARED once the instant has come and the plan without preparation would start it.
pub(super) fn settle(cfg: &Config, s: &State, uid: u8) -> Pc {
    let (st, rv) = (s.status, s.rv);
    let job = s.jobs[uid as usize];
    let withdraw = |marked| next(cfg, rv, st, uid, None, marked);
    let promote = Pc::Promote { rv, base: st, uid };
    let missing = !job.live;
    // Its instant is when its period falls due (the model's clock is exact: its lower and upper
    // bounds are one).
    let came = s.due > job.period;
    // (0) Gone once its instant came: it may have been resumed, and run. Promoted (recorded as a
    // Job gone), whatever changed since: never withdrawn and its period run again (G1).
    if missing && came && !judge_gone_late(cfg) {
        return promote;
    }
    // (1) What the Job says: resumed (its release), or marked withdrawn.
    if job.live && job.resumed {
        return promote;
    }
    if job.live && job.withdrawn {
        return withdraw(true);
    }
    // (2) P2 and the cursor; (3) the basis: the user's edit.
    if job.token != st.token || st.decided > job.period || s.edited {
        return withdraw(missing);
    }
    // (4) Gone before its instant: it never ran. (After it: (0); here only in the old order.)
    if missing {
        return if came { promote } else { withdraw(true) };
    }
    // (7) Keep: never before its instant (G4).
    if s.due <= job.period {
        return Pc::Idle;
    }
    // (8) The plan without preparation: catchUp Latest starts the newest due period only.
    if s.due - 1 > job.period {
        return withdraw(false);
    }
    Pc::ResumePrepared { rv, base: st, uid }
}

/// One step of an actor in a prepared run's round, on `n` (a copy of `s`); returns its label.
pub(super) fn step(
    cfg: &Config,
    s: &State,
    a: usize,
    on: bool,
    cov: &mut u64,
    n: &mut State,
) -> String {
    let name = NAMES[a];
    match s.actors[a] {
        Pc::ResumePrepared { rv, base, uid } => {
            let u = uid as usize;
            let job = s.jobs[u];
            let released_false = !job.withdrawn || cfg.broken == Broken::NoReleasedTest;
            if job.live && job.suspended() && released_false {
                n.start(u);
                *cov |= Cov::PreparedResumed.bit();
                n.actors[a] = Pc::Promote { rv, base, uid };
                say!(on, "{name} resumes prepared {} at its instant", j(s, u))
            } else {
                if job.live && job.withdrawn {
                    *cov |= Cov::ResumeFoundWithdrawn.bit();
                }
                n.actors[a] = Pc::ResumeReread { rv, base, uid };
                let why = match (job.live, job.withdrawn) {
                    (false, _) => "404",
                    (true, true) => "the released test fails (withdrawn)",
                    (true, false) => "the suspend test fails (resumed)",
                };
                say!(on, "{name}'s resume of prepared {}: {why}", j(s, u))
            }
        }
        Pc::ResumeReread { rv, base, uid } => {
            let u = uid as usize;
            let job = s.jobs[u];
            n.actors[a] = if job.live && job.resumed {
                Pc::Promote { rv, base, uid }
            } else if job.live && job.withdrawn {
                next(cfg, rv, base, uid, None, true)
            } else {
                Pc::Idle
            };
            say!(on, "{name} reads {}: {:?}", j(s, u), n.actors[a])
        }
        Pc::Promote { rv, base, uid } => {
            let u = uid as usize;
            let job = s.jobs[u];
            let mut st = base;
            if st.prepared == Some(uid) {
                st.prepared = None;
            }
            st.token = st.token.max(job.token);
            st.active |= bit(u);
            st.decided = st.decided.max(job.period + 1);
            st.recorded[job.period as usize] = Rec::Running(job.token);
            n.actors[a] = Pc::Idle;
            if n.cas(cfg, rv, st) {
                n.jobs[u].confirmed = true;
                if !job.live {
                    *cov |= Cov::GonePromoted.bit();
                }
                say!(on, "{name} promotes {} (rv {rv} -> {})", j(s, u), n.rv)
            } else {
                say!(on, "{name}'s promote of {} gets 409", j(s, u))
            }
        }
        Pc::Withdraw {
            rv,
            base,
            uid,
            step,
            marked,
        } => withdraw(cfg, s, a, on, cov, n, (rv, base, uid, step, marked)),
        pc => unreachable!("not a prepared run's step: {pc:?}"),
    }
}

/// One step of a withdrawal (`w`: the judge's resourceVersion and status, the Job's uid, the
/// step, whether W1 is done).
fn withdraw(
    cfg: &Config,
    s: &State,
    a: usize,
    on: bool,
    cov: &mut u64,
    n: &mut State,
    w: (u16, Status, u8, WStep, bool),
) -> String {
    let (rv, base, uid, step, marked) = w;
    let name = NAMES[a];
    let u = uid as usize;
    let job = s.jobs[u];
    // Whether the Job's instant has come (the model's clock: when its period fell due).
    let came = s.due > job.period;
    let go_on = |marked| next(cfg, rv, base, uid, Some(step), marked);
    match step {
        // 404 once the instant may have passed: the Job may have been resumed by another
        // replica and run, then deleted (by a user, by history limits). The withdrawal stops
        // there; the next judge decides (it promotes a Job gone after its instant).
        WStep::Mark if !job.live && came && !mark_gone_goes_on(cfg) => {
            *cov |= Cov::WithdrawalFoundGone.bit();
            n.actors[a] = Pc::Idle;
            say!(
                on,
                "{name}'s W1 mark of {}: 404 past its instant, stops",
                j(s, u)
            )
        }
        // 404 before it: it never ran (nothing resumes a prepared Job before its instant).
        WStep::Mark if !job.live => {
            n.actors[a] = go_on(true);
            say!(on, "{name}'s W1 mark of {}: 404, goes on", j(s, u))
        }
        WStep::Mark if !job.resumed && !job.withdrawn => {
            n.jobs[u].withdrawn = true;
            n.actors[a] = go_on(true);
            say!(on, "{name} marks {} withdrawn (W1)", j(s, u))
        }
        WStep::Mark => {
            n.actors[a] = Pc::Withdraw {
                step: WStep::Reread,
                rv,
                base,
                uid,
                marked,
            };
            say!(on, "{name}'s W1 mark of {}: the test fails", j(s, u))
        }
        WStep::Reread if job.live && job.resumed => {
            *cov |= Cov::MarkFoundResumed.bit();
            n.actors[a] = Pc::Promote { rv, base, uid };
            say!(on, "{name} reads {}: resumed, promotes it instead", j(s, u))
        }
        // Gone once the instant may have passed: as W1's 404, stops; the next judge decides.
        WStep::Reread if !job.live && came && !mark_gone_goes_on(cfg) => {
            *cov |= Cov::WithdrawalFoundGone.bit();
            n.actors[a] = Pc::Idle;
            say!(on, "{name} reads {}: gone past its instant, stops", j(s, u))
        }
        WStep::Reread if !job.live || job.withdrawn => {
            n.actors[a] = go_on(true);
            say!(on, "{name} reads {}: withdrawn or gone, goes on", j(s, u))
        }
        // Still marked not released (not reached: the marks only move on, and a uid is one Job).
        WStep::Reread => {
            n.actors[a] = Pc::Idle;
            say!(on, "{name} reads {}: not released, stops", j(s, u))
        }
        WStep::Archive if !cfg.backstop => {
            n.actors[a] = go_on(marked);
            say!(
                on,
                "{name} has no backstop to withdraw {}'s claim from",
                j(s, u)
            )
        }
        WStep::Archive => {
            let p = job.period as usize;
            if n.rows[p] == Some(job.token) {
                n.rows[p] = None;
            }
            n.retire(bit(u), cov);
            n.actors[a] = go_on(marked);
            say!(
                on,
                "{name} archives claim row p{p}/t{} and retires its token (W2+W3)",
                job.token
            )
        }
        WStep::Record => {
            let mut st = base;
            if st.prepared == Some(uid) {
                st.prepared = None;
            }
            if n.cas(cfg, rv, st) {
                *cov |= Cov::PreparedWithdrawn.bit();
                n.actors[a] = go_on(marked);
                say!(on, "{name} records the withdrawal of {} (W4)", j(s, u))
            } else {
                n.actors[a] = Pc::Idle;
                say!(on, "{name}'s W4 record of {} gets 409", j(s, u))
            }
        }
        WStep::Delete => {
            n.delete(u, false);
            n.actors[a] = go_on(marked);
            say!(on, "{name} deletes withdrawn {} by uid (W5)", j(s, u))
        }
    }
}

/// Break-lock's step 1b, on `n`: the prepared run's Job, if still marked `released: "false"`,
/// is marked withdrawn (W1 with reason LockBroken). Returns whether it was.
pub(super) fn break_lock_mark(n: &mut State, cov: &mut u64) -> bool {
    let Some(uid) = n.status.prepared else {
        return false;
    };
    let job = &mut n.jobs[uid as usize];
    if !job.live || job.resumed || job.withdrawn {
        return false;
    }
    job.withdrawn = true;
    *cov |= Cov::LockBrokeMarked.bit();
    true
}

/// The environment's PREPARE and EDIT, into `out`.
///
/// PREPARE, once: the next period's run, ahead of its instant, when nothing is pending or active
/// and every due period is decided (P1, `prepare_from`): its claim row inserted and the fence
/// advanced to a new token, its Job created suspended with `released: "false"`, and one status
/// write (a CAS: the resourceVersion moves) naming its uid in `prepared`, the token its, the
/// cursor not moved (steps 3 to 7 of the protocol, with the cursor left, as one step).
///
/// EDIT, once, while a run is prepared: the user's edit that makes the prepared period not to be
/// run at its instant (a generation bump: the prepared run's basis no longer matches; the
/// resourceVersion moves).
pub(super) fn environment(cfg: &Config, s: &State, on: bool, out: &mut Out) {
    let st = s.status;
    let p = s.due;
    let ready = p < PERIODS
        && st.prepared.is_none()
        && st.pending.is_none()
        && st.active == 0
        && st.decided == p;
    if !s.prepped && ready && s.rows[p as usize].is_none() && s.live_job(p).is_none() {
        let mut n = *s;
        let token = st.token.max(s.fence) + 1;
        if cfg.backstop {
            n.rows[p as usize] = Some(token);
            n.fence = token;
        }
        let claim = Claim {
            period: p,
            token,
            replaces: 0,
        };
        let uid = n.create(cfg, claim, &mut 0);
        n.jobs[uid].prepared = true;
        n.prepped = true;
        let mut next = st;
        next.token = token;
        if cfg.broken == Broken::PreparedInActive {
            next.active |= bit(uid);
        } else {
            next.prepared = Some(uid as u8);
        }
        assert!(n.cas(cfg, s.rv, next));
        let l = say!(on, "{} is prepared for period {p}'s instant", j(&n, uid));
        out.push((n, l));
    }
    if !s.edited && st.prepared.is_some() {
        let mut n = *s;
        n.edited = true;
        n.rv += 1;
        out.push((n, say!(on, "a user edits the SingletonJob (generation +1)")));
    }
}

/// [`Inv::LostToPreparation`], at quiescence: a period a run was prepared for neither ran nor
/// was recorded, or was recorded Deduplicated with no run of it.
pub(super) fn lost(s: &State) -> u32 {
    let lost = (0..PERIODS).any(|p| {
        let of = |j: &&Job| j.period == p;
        if !s.jobs().iter().filter(of).any(|j| j.prepared) {
            return false;
        }
        let ran = s
            .jobs()
            .iter()
            .filter(of)
            .any(|j| j.resumed && j.token != 0);
        match s.status.recorded[p as usize] {
            Rec::None => true,
            Rec::Deduplicated => !ran,
            _ => false,
        }
    });
    if lost {
        Inv::LostToPreparation.bit()
    } else {
        0
    }
}
