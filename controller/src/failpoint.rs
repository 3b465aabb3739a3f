//! Named points inside the run protocol where tests pause or crash the process (issue 16).
//!
//! Compiled in only with the `failpoints` cargo feature, which the e2e build enables
//! (`make e2e`); in every other build [`hit`] is an empty inline function. A test arms points
//! with `SINGLETON_FAILPOINTS=name=action[,name=action...]`:
//!
//! - `stop`: the process sends itself SIGSTOP the first time it reaches the point, exactly as a
//!   GC or VM pause would freeze it there (every thread, the Lease renewal included), until the
//!   test sends SIGCONT. Later hits pass.
//! - `abort`: the process aborts there (a crash between two steps), the first time.
//!
//! Hand-written rather than the `fail` crate: its pause blocks one thread until the test flips
//! the point from inside the process, while what hurts is the whole process frozen past its
//! Lease, released from outside.

/// The points, in the order a run passes them ([`crate::run`] numbers the steps).
pub const POINTS: &[&str] = &[
    SCHEMA_LOCKED,
    CLAIM_WRITTEN,
    BACKSTOP_CLAIMED,
    REREAD,
    CREATE_LANE,
    CONFIRM,
    RESUME,
    PREPARE_CONFIRMED,
    RESUME_PREPARED,
    PROMOTE,
    WITHDRAW_MARKED,
    WITHDRAW_BACKSTOP,
    WITHDRAW_RECORDED,
];
/// Inside the backstop's schema migration, holding its advisory lock (before any claim: a
/// connection's first use).
pub const SCHEMA_LOCKED: &str = "schema-locked";
/// After the claim's status write succeeded (step 3).
pub const CLAIM_WRITTEN: &str = "claim-written";
/// After the backstop recorded the claim (step 4).
pub const BACKSTOP_CLAIMED: &str = "backstop-claimed";
/// After the re-read found the claim still pending (step 4, re-check).
pub const REREAD: &str = "reread";
/// Inside the create lane, after the gate check, right before the create is sent (step 6).
pub const CREATE_LANE: &str = "create-lane";
/// Before the confirm's compare-and-swap is sent (step 7).
pub const CONFIRM: &str = "confirm";
/// After the gate check, right before the resume is sent (step 8).
pub const RESUME: &str = "resume";
/// A preparation (issue 33): after the confirm wrote the run into `status.prepared`, before
/// anything else (its resume comes at its instant).
pub const PREPARE_CONFIRMED: &str = "prepare-confirmed";
/// A prepared run ([`crate::run::prepared`]): after the gate check, right before its resume
/// (the one request at its instant) is sent.
pub const RESUME_PREPARED: &str = "resume-prepared";
/// A prepared run resumed: before the status write that makes it active.
pub const PROMOTE: &str = "promote";
/// A prepared run's withdrawal: after its Job was marked withdrawn (W1).
pub const WITHDRAW_MARKED: &str = "withdraw-marked";
/// A prepared run's withdrawal: after its backstop claim was archived and its token retired
/// (W2, W3).
pub const WITHDRAW_BACKSTOP: &str = "withdraw-backstop";
/// A prepared run's withdrawal: after the status write that clears it (W4).
pub const WITHDRAW_RECORDED: &str = "withdraw-recorded";

/// Reached `point`: acts if a test armed it (feature `failpoints`), else nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_point: &'static str) {}

#[cfg(feature = "failpoints")]
pub use armed::hit;

#[cfg(feature = "failpoints")]
mod armed {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Action {
        Stop,
        Abort,
    }

    /// The armed points not yet fired.
    fn armed() -> &'static Mutex<HashMap<String, Action>> {
        static ARMED: OnceLock<Mutex<HashMap<String, Action>>> = OnceLock::new();
        ARMED.get_or_init(|| {
            let spec = std::env::var("SINGLETON_FAILPOINTS").unwrap_or_default();
            Mutex::new(parse(&spec))
        })
    }

    fn parse(spec: &str) -> HashMap<String, Action> {
        spec.split(',')
            .filter_map(|item| {
                let (name, action) = item.trim().split_once('=')?;
                let action = match action.trim() {
                    "stop" => Action::Stop,
                    "abort" => Action::Abort,
                    other => {
                        // Start-up of a test build: a typo must not silently test nothing.
                        panic!("SINGLETON_FAILPOINTS: unknown action {other:?} for {name}");
                    }
                };
                if !super::POINTS.contains(&name.trim()) {
                    panic!("SINGLETON_FAILPOINTS: unknown point {name:?}");
                }
                Some((name.trim().to_string(), action))
            })
            .collect()
    }

    pub fn hit(point: &'static str) {
        let action = crate::sync::lock(armed()).remove(point);
        match action {
            None => {}
            Some(Action::Stop) => {
                // The log line is how a test (and a human reading its dump) sees where it stopped.
                tracing::warn!(
                    failpoint = point,
                    "failpoint: stopping the process (SIGSTOP)"
                );
                // SAFETY: raise(2) has no memory-safety preconditions.
                unsafe {
                    libc::raise(libc::SIGSTOP);
                }
                tracing::warn!(failpoint = point, "failpoint: continued");
            }
            Some(Action::Abort) => {
                tracing::warn!(failpoint = point, "failpoint: aborting the process");
                std::process::abort();
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parses_points_and_actions() {
            let m = parse("claim-written=stop, create-lane=abort");
            assert_eq!(m.get("claim-written"), Some(&Action::Stop));
            assert_eq!(m.get("create-lane"), Some(&Action::Abort));
            assert!(parse("").is_empty());
        }

        #[test]
        #[should_panic(expected = "unknown point")]
        fn an_unknown_point_is_refused() {
            parse("claim-writen=stop");
        }
    }
}
