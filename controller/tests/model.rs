//! An explicit-state model check of the claim protocol (src/run.rs), explored exhaustively.
//!
//! The world: the API server's SingletonJob (status with a resourceVersion), its Job store (name
//! uniqueness: one live Job per period name), the backstop (claim rows UNIQUE(job, period) and the
//! fence), the workload's resource (accepts a write only through the fence check), a clock that
//! makes two periods fall due, and two controller actors A and B.
//!
//! Each actor runs the protocol's steps as separate atomic transitions: read; token =
//! max(status, fence) + 1; claim by compare-and-swap on the status; backstop claim; delete the
//! replaced Jobs; create the Job by its deterministic name (409 with the same token is fine);
//! confirm by compare-and-swap. A pending claim found on read is completed (complete_claim) with
//! its name and token. Only the leader may *begin* a round (the gate); a round already begun goes
//! on whoever leads now: that is a leader paused past its lease (or a request stalled in a TCP
//! buffer) resuming with its stale read. Leadership moves at any time and an actor may crash at
//! any step (losing its local state). The environment finishes Jobs, deletes finished Jobs that
//! status no longer references (history pruning, a user's `kubectl delete`) where the
//! configuration allows it, and lets each run's workload make one fenced write at any time.
//!
//! Every interleaving is explored (breadth first, with a visited set); invariants are checked in
//! every state, and a violation comes with the shortest trace that reaches it.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// Periods in the model.
const PERIODS: u8 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    Forbid,
    Replace,
}

/// Deliberately broken protocols, to show the checker is not vacuous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broken {
    None,
    /// Status writes without the resourceVersion precondition (a blind PUT).
    BlindStatusWrite,
    /// The Job is created before the status claim is written.
    CreateBeforeClaim,
}

#[derive(Clone, Copy, Debug)]
struct Config {
    policy: Policy,
    backstop: bool,
    /// Finished Jobs that status no longer references may be deleted (history pruning with a
    /// limit of 0, or a user). Replace deletes Jobs itself regardless.
    prune: bool,
    broken: Broken,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Claim {
    period: u8,
    token: u8,
}

/// What status records for a period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Rec {
    None,
    Running(u8),
    Missed,
    Deduplicated,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Status {
    token: u8,
    /// Periods < decided are decided (status.decidedThrough as a count).
    decided: u8,
    pending: Option<Claim>,
    active: Vec<Claim>,
    recorded: [Rec; PERIODS as usize],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Job {
    period: u8,
    token: u8,
    /// Exists in the API server (a deleted Job frees its name).
    live: bool,
    finished: bool,
    /// Its workload made its one write (accepted or refused).
    wrote: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Stage {
    Backstop,
    Replace,
    Create,
    Confirm,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Pc {
    Idle,
    /// Read done, a period to start: next is reading the fence and computing the token.
    Token {
        rv: u16,
        next: Status,
        period: u8,
        replace: Vec<Claim>,
    },
    /// Token computed: next is the claim write (compare-and-swap on `rv`).
    Claim {
        rv: u16,
        next: Status,
        claim: Claim,
        replace: Vec<Claim>,
        /// Broken::CreateBeforeClaim: whether the Job was already created.
        created: bool,
    },
    /// Steps 4 to 7 of a claim; `base` is the status as claimed, `rv` its resourceVersion.
    Complete {
        rv: u16,
        base: Status,
        claim: Claim,
        replace: Vec<Claim>,
        stage: Stage,
    },
    /// A plain status write (records, finished runs, a decision without a Job).
    Write {
        rv: u16,
        next: Status,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    due: u8,
    leader: u8,
    rv: u16,
    status: Status,
    /// Every Job ever created, in creation order.
    jobs: Vec<Job>,
    claims: [Option<u8>; PERIODS as usize],
    /// The backstop's fence (also the workload's resource fence when the backstop is on).
    fence: u8,
    /// The workload's resource fence without a backstop (only its own writes advance it).
    wfence: u8,
    /// A write was accepted although a Job with a newer token had been created before it.
    stale_accepted: bool,
    stale_refused: bool,
    actors: [Pc; 2],
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
            active: Vec::new(),
            recorded: [Rec::None; PERIODS as usize],
        },
        jobs: Vec::new(),
        claims: [None; PERIODS as usize],
        fence: 0,
        wfence: 0,
        stale_accepted: false,
        stale_refused: false,
        actors: [Pc::Idle, Pc::Idle],
    }
}

fn live_job(s: &State, period: u8) -> Option<usize> {
    s.jobs.iter().position(|j| j.live && j.period == period)
}

/// The read and decide of a reconcile (decide::plan, catchUp Latest), for actor `a`.
fn read(cfg: &Config, s: &State) -> Pc {
    let st = &s.status;
    if let Some(claim) = st.pending {
        // A claim left half-done: complete it first, with its name and token (and nothing to
        // replace: complete_claim is called with `&[]`).
        return Pc::Complete {
            rv: s.rv,
            base: st.clone(),
            claim,
            replace: Vec::new(),
            stage: Stage::Backstop,
        };
    }
    let mut next = st.clone();
    // Runs whose Job finished or is gone leave `active`.
    next.active.retain(|r| {
        live_job(s, r.period)
            .map(|i| s.jobs[i].token == r.token && !s.jobs[i].finished)
            .unwrap_or(false)
    });
    if st.decided < s.due {
        // catchUp Latest: older pending periods are recorded as Missed with the write.
        let newest = s.due - 1;
        let blocked = cfg.policy == Policy::Forbid && !next.active.is_empty();
        if !blocked {
            for p in st.decided..newest {
                next.recorded[p as usize] = Rec::Missed;
            }
            next.decided = newest;
            let replace = if cfg.policy == Policy::Replace {
                next.active.clone()
            } else {
                Vec::new()
            };
            return Pc::Token {
                rv: s.rv,
                next,
                period: newest,
                replace,
            };
        }
    }
    if next != *st {
        Pc::Write { rv: s.rv, next }
    } else {
        Pc::Idle
    }
}

/// A status write with the resourceVersion precondition (or without, when broken).
fn cas(cfg: &Config, s: &mut State, rv: u16, next: Status) -> bool {
    if rv != s.rv && cfg.broken != Broken::BlindStatusWrite {
        return false; // 409 Conflict
    }
    s.status = next;
    s.rv += 1;
    true
}

enum Created {
    Ok,
    Foreign,
}

fn create_job(s: &mut State, claim: Claim) -> Created {
    match live_job(s, claim.period) {
        Some(i) if s.jobs[i].token == claim.token => Created::Ok,
        Some(_) => Created::Foreign,
        None => {
            s.jobs.push(Job {
                period: claim.period,
                token: claim.token,
                live: true,
                finished: false,
                wrote: false,
            });
            Created::Ok
        }
    }
}

/// One step of actor `a`; None when it has none.
fn step(cfg: &Config, s: &State, a: usize) -> Option<(State, String)> {
    let mut n = s.clone();
    let name = ["A", "B"][a];
    let label;
    match s.actors[a].clone() {
        Pc::Idle => {
            if s.leader as usize != a {
                return None;
            }
            let pc = read(cfg, s);
            if pc == Pc::Idle {
                return None;
            }
            label = format!("{name} reads rv {} and plans {pc:?}", s.rv);
            n.actors[a] = pc;
        }
        Pc::Token {
            rv,
            next,
            period,
            replace,
        } => {
            let fence = if cfg.backstop { s.fence } else { 0 };
            let claim = Claim {
                period,
                token: next.token.max(fence) + 1,
            };
            label = format!("{name} computes token {} for period {period}", claim.token);
            n.actors[a] = Pc::Claim {
                rv,
                next,
                claim,
                replace,
                created: false,
            };
        }
        Pc::Claim {
            rv,
            mut next,
            claim,
            replace,
            created,
        } => {
            if cfg.broken == Broken::CreateBeforeClaim && !created {
                label = format!("{name} creates Job {claim:?} before its claim (broken)");
                match create_job(&mut n, claim) {
                    Created::Ok => {
                        n.actors[a] = Pc::Claim {
                            rv,
                            next,
                            claim,
                            replace,
                            created: true,
                        }
                    }
                    Created::Foreign => n.actors[a] = Pc::Idle,
                }
                return Some((n, label));
            }
            next.token = claim.token;
            next.decided = claim.period + 1;
            next.pending = Some(claim);
            if cas(cfg, &mut n, rv, next.clone()) {
                label = format!("{name} claims {claim:?} (rv {rv} -> {})", n.rv);
                n.actors[a] = Pc::Complete {
                    rv: n.rv,
                    base: next,
                    claim,
                    replace,
                    stage: Stage::Backstop,
                };
            } else {
                label = format!("{name}'s claim {claim:?} gets 409 (rv {rv} != {})", s.rv);
                n.actors[a] = Pc::Idle;
            }
        }
        Pc::Complete {
            rv,
            base,
            claim,
            replace,
            stage,
        } => {
            let go = |stage| Pc::Complete {
                rv,
                base: base.clone(),
                claim,
                replace: replace.clone(),
                stage,
            };
            match stage {
                Stage::Backstop if !cfg.backstop => {
                    label = format!("{name} (no backstop) goes on with {claim:?}");
                    n.actors[a] = go(Stage::Replace);
                }
                Stage::Backstop => {
                    let p = claim.period as usize;
                    match s.claims[p] {
                        Some(t) if t == claim.token => {
                            label = format!("{name} finds its own claim row {claim:?}");
                            n.actors[a] = go(Stage::Replace);
                        }
                        Some(t) => {
                            label = format!("{name}: period {p} already claimed with token {t}");
                            let mut next = base.clone();
                            next.pending = None;
                            next.recorded[p] = Rec::Deduplicated;
                            n.actors[a] = Pc::Write { rv, next };
                        }
                        None if s.fence < claim.token => {
                            label = format!(
                                "{name} inserts claim row {claim:?}, fence -> {}",
                                claim.token
                            );
                            n.claims[p] = Some(claim.token);
                            n.fence = claim.token;
                            n.actors[a] = go(Stage::Replace);
                        }
                        None => {
                            label = format!(
                                "{name}: stale token {} below fence {}",
                                claim.token, s.fence
                            );
                            n.actors[a] = Pc::Idle;
                        }
                    }
                }
                Stage::Replace => {
                    label = format!("{name} deletes replaced Jobs {replace:?}");
                    for old in &replace {
                        // delete_job deletes by name, whatever Job has it now.
                        if let Some(i) = live_job(&n, old.period) {
                            n.jobs[i].live = false;
                        }
                    }
                    n.actors[a] = go(Stage::Create);
                }
                Stage::Create => {
                    if cfg.broken == Broken::CreateBeforeClaim {
                        label = format!("{name} already created {claim:?}");
                        n.actors[a] = go(Stage::Confirm);
                    } else {
                        match create_job(&mut n, claim) {
                            Created::Ok => {
                                label = format!("{name} creates (or finds its own) Job {claim:?}");
                                n.actors[a] = go(Stage::Confirm);
                            }
                            Created::Foreign => {
                                label = format!(
                                    "{name}: Job for period {} has another token",
                                    claim.period
                                );
                                n.actors[a] = Pc::Idle;
                            }
                        }
                    }
                }
                Stage::Confirm => {
                    let mut next = base.clone();
                    next.pending = None;
                    next.active.retain(|r| !replace.contains(r));
                    next.active.push(claim);
                    next.recorded[claim.period as usize] = Rec::Running(claim.token);
                    let ok = cas(cfg, &mut n, rv, next);
                    label = format!(
                        "{name} confirms {claim:?}: {}",
                        if ok { "ok" } else { "409" }
                    );
                    n.actors[a] = Pc::Idle;
                }
            }
        }
        Pc::Write { rv, next } => {
            let ok = cas(cfg, &mut n, rv, next);
            label = format!("{name} writes status: {}", if ok { "ok" } else { "409" });
            n.actors[a] = Pc::Idle;
        }
    }
    Some((n, label))
}

fn successors(cfg: &Config, s: &State) -> Vec<(State, String)> {
    let mut out = Vec::new();
    for a in 0..2 {
        if let Some(t) = step(cfg, s, a) {
            out.push(t);
        }
        if s.actors[a] != Pc::Idle {
            let mut n = s.clone();
            n.actors[a] = Pc::Idle;
            out.push((n, format!("{} crashes and restarts", ["A", "B"][a])));
        }
    }
    {
        let mut n = s.clone();
        n.leader = 1 - s.leader;
        out.push((
            n,
            format!("leadership moves to {}", ["A", "B"][1 - s.leader as usize]),
        ));
    }
    if s.due < PERIODS {
        let mut n = s.clone();
        n.due += 1;
        out.push((n, format!("period {} falls due", s.due)));
    }
    for (i, j) in s.jobs.iter().enumerate() {
        if j.live && !j.finished {
            let mut n = s.clone();
            n.jobs[i].finished = true;
            out.push((n, format!("Job {}/{} finishes", j.period, j.token)));
        }
        let referenced = s.status.active.iter().any(|r| r.period == j.period)
            || s.status.pending.is_some_and(|r| r.period == j.period);
        if cfg.prune && j.live && j.finished && !referenced {
            let mut n = s.clone();
            n.jobs[i].live = false;
            out.push((
                n,
                format!("finished Job {}/{} is pruned", j.period, j.token),
            ));
        }
        if !j.wrote && !j.finished {
            let mut n = s.clone();
            n.jobs[i].wrote = true;
            let f = if cfg.backstop {
                &mut n.fence
            } else {
                &mut n.wfence
            };
            let accepted = j.token >= *f;
            let newer_exists = s.jobs.iter().any(|o| o.token > j.token);
            if accepted {
                *f = j.token;
                n.stale_accepted |= newer_exists;
            } else {
                n.stale_refused = true;
            }
            let verdict = if accepted { "accepted" } else { "refused" };
            out.push((
                n,
                format!("workload of Job {}/{} writes: {verdict}", j.period, j.token),
            ));
        }
    }
    out
}

/// The invariants; the name of the first one violated.
fn violated(cfg: &Config, s: &State) -> Option<&'static str> {
    violations(cfg, s).into_iter().next()
}

/// The names of every invariant `s` violates.
fn violations(cfg: &Config, s: &State) -> Vec<&'static str> {
    let mut out = Vec::new();
    // G1: never two Jobs for one period, over every Job ever created.
    for (i, a) in s.jobs.iter().enumerate() {
        if s.jobs[i + 1..].iter().any(|b| b.period == a.period) {
            out.push("G1: two Jobs for one period");
            break;
        }
    }
    // G3: tokens of created Jobs strictly increase in creation order (so none is reused).
    if s.jobs.windows(2).any(|w| w[1].token <= w[0].token) {
        out.push("G3: Job tokens not strictly increasing in creation order");
    }
    // Fencing (G5): with the backstop, the fence is advanced before a Job exists, so a write with
    // an older token is never accepted once a newer run was created.
    if cfg.backstop && s.stale_accepted {
        out.push("fencing: a stale write was accepted after a newer token advanced the fence");
    }
    // G5 Forbid: never two runs active at once.
    if cfg.policy == Policy::Forbid && s.jobs.iter().filter(|j| j.live && !j.finished).count() > 1 {
        out.push("G5: two active runs under Forbid");
    }
    // G2: whenever no claim is half-done, every decided period has a Job or a recorded outcome.
    if s.status.pending.is_none() {
        for p in 0..s.status.decided {
            let ran = s.jobs.iter().any(|j| j.period == p);
            let rec = matches!(
                s.status.recorded[p as usize],
                Rec::Missed | Rec::Deduplicated
            );
            if !ran && !rec {
                out.push("G2: a decided period has neither a Job nor a recorded outcome");
                break;
            }
        }
    }
    // G2 at quiescence: all periods due, nobody mid-step, nothing left to decide ⇒ all decided.
    let quiet = s.due == PERIODS
        && s.actors.iter().all(|p| *p == Pc::Idle)
        && s.status.pending.is_none()
        && matches!(read(cfg, s), Pc::Idle)
        && s.status.active.is_empty();
    if quiet && s.status.decided < PERIODS {
        out.push("G2: quiescent with a period undecided");
    }
    out
}

struct Report {
    states: usize,
    violation: Option<(&'static str, Vec<String>)>,
    stale_refused: bool,
}

/// Breadth-first search over every interleaving; stops at the first violation (shortest trace).
fn explore(cfg: &Config) -> Report {
    let mut index: HashMap<State, usize> = HashMap::new();
    let mut parent: Vec<(usize, String)> = Vec::new();
    let mut states: Vec<State> = Vec::new();
    let mut queue = VecDeque::new();
    let s0 = initial();
    index.insert(s0.clone(), 0);
    states.push(s0);
    parent.push((usize::MAX, "start".into()));
    queue.push_back(0usize);
    let mut stale_refused = false;
    while let Some(i) = queue.pop_front() {
        let s = states[i].clone();
        stale_refused |= s.stale_refused;
        if let Some(what) = violated(cfg, &s) {
            let mut trace = Vec::new();
            let mut k = i;
            while k != usize::MAX {
                trace.push(parent[k].1.clone());
                k = parent[k].0;
            }
            trace.reverse();
            return Report {
                states: states.len(),
                violation: Some((what, trace)),
                stale_refused,
            };
        }
        for (n, label) in successors(cfg, &s) {
            if !index.contains_key(&n) {
                let k = states.len();
                index.insert(n.clone(), k);
                states.push(n);
                parent.push((i, label));
                queue.push_back(k);
            }
        }
    }
    Report {
        states: states.len(),
        violation: None,
        stale_refused,
    }
}

fn run(cfg: Config) -> Report {
    let t = Instant::now();
    let r = explore(&cfg);
    eprintln!(
        "{cfg:?}: {} states in {:.2?}; {}",
        r.states,
        t.elapsed(),
        match &r.violation {
            None => "no violation".to_string(),
            Some((what, trace)) => format!("{what}, trace:\n    {}", trace.join("\n    ")),
        }
    );
    r
}

fn cfg(policy: Policy, backstop: bool, prune: bool) -> Config {
    Config {
        policy,
        backstop,
        prune,
        broken: Broken::None,
    }
}

/// Forbid without Job deletion, with and without the backstop: every invariant holds.
#[test]
fn claim_protocol_holds_when_jobs_are_not_deleted() {
    let mut total = 0;
    let t = Instant::now();
    for backstop in [false, true] {
        let r = run(cfg(Policy::Forbid, backstop, false));
        total += r.states;
        assert!(r.violation.is_none(), "{:?}", r.violation);
    }
    eprintln!("total {total} states in {:.2?}", t.elapsed());
}

/// With the backstop, whatever happens to Jobs (Replace deletes them; pruning deletes finished
/// ones), a stale run's write is never accepted after a newer token was issued, every decided
/// period is accounted for, and the fence was exercised (some stale write was refused).
#[test]
fn with_the_backstop_stale_runs_are_fenced_even_when_jobs_are_deleted() {
    for (policy, prune) in [(Policy::Replace, false), (Policy::Forbid, true)] {
        let mut c = cfg(policy, true, prune);
        // Only the fencing and G2 invariants are asserted here: see the ignored test below for
        // G1/G3 at the level of Job objects.
        let r = explore_with(&mut c, |v| v.starts_with("fencing") || v.starts_with("G2"));
        assert!(r.violation.is_none(), "{policy:?}: {:?}", r.violation);
        assert!(r.stale_refused, "{policy:?}: the fence was never exercised");
    }
}

/// The one window the protocol can narrow but not close, because Kubernetes has no conditional
/// create: a claimer paused (or whose create request stalls) after its last check that the claim
/// is still pending, while another replica completes the claim and the Job is then deleted
/// (Replace, history pruning, a user), re-creates the period's Job with its old token. The
/// controller now re-reads the claim right before the create and, when it loses the confirm,
/// deletes a Job the winning status does not know (by uid), so the window is one request wide and
/// the duplicate short-lived; with the backstop its writes are refused by the fence throughout
/// (`with_the_backstop_stale_runs_are_fenced_even_when_jobs_are_deleted`). This model does not
/// include those two mitigations and still finds the window; run with `--include-ignored` to see
/// the trace. docs/design.md states the residual risk.
#[test]
#[ignore = "documents the window no Kubernetes API can close; see the doc comment and docs/design.md"]
fn a_stale_leader_never_recreates_a_deleted_job() {
    for c in [
        cfg(Policy::Replace, false, false),
        cfg(Policy::Replace, true, false),
        cfg(Policy::Forbid, false, true),
        cfg(Policy::Forbid, true, true),
    ] {
        let r = run(c);
        assert!(r.violation.is_none(), "{c:?}: {:?}", r.violation);
    }
}

/// The checker finds the violations of deliberately broken protocols, so it cannot pass vacuously.
#[test]
fn broken_variants_are_caught() {
    for broken in [Broken::BlindStatusWrite, Broken::CreateBeforeClaim] {
        for backstop in [false, true] {
            let r = run(Config {
                policy: Policy::Forbid,
                backstop,
                prune: false,
                broken,
            });
            let (what, trace) = r.violation.expect("the broken protocol must be caught");
            assert!(!trace.is_empty(), "{broken:?}: {what}");
        }
    }
}

/// Explores with only the invariants whose name `keep` accepts.
fn explore_with(c: &mut Config, keep: impl Fn(&str) -> bool) -> Report {
    let t = Instant::now();
    let mut index: HashMap<State, usize> = HashMap::new();
    let mut queue = VecDeque::new();
    index.insert(initial(), 0);
    queue.push_back(initial());
    let mut stale_refused = false;
    let mut found = None;
    while let Some(s) = queue.pop_front() {
        stale_refused |= s.stale_refused;
        if let Some(v) = violations(c, &s).into_iter().find(|v| keep(v)) {
            found = Some((v, vec![format!("{s:?}")]));
            break;
        }
        // A state violating an invariant not checked here is still explored further.
        for (n, _) in successors(c, &s) {
            if !index.contains_key(&n) {
                index.insert(n.clone(), index.len());
                queue.push_back(n);
            }
        }
    }
    eprintln!(
        "{c:?} (filtered): {} states in {:.2?}",
        index.len(),
        t.elapsed()
    );
    Report {
        states: index.len(),
        violation: found,
        stale_refused,
    }
}
