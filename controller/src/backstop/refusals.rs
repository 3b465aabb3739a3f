//! The refusals every engine's fence raises inside the workload's transaction, with the same
//! codes (SQLSTATE) and meanings, so that a workload and the client libraries (docs/fencing.md)
//! handle them alike whatever database the backstop is: `<p>` is the table prefix.

/// The SQLSTATE `<p>fence()` raises for a stale token.
pub const STALE_TOKEN_SQLSTATE: &str = "SF001";

/// The SQLSTATE `<p>fence()` raises for a caller whose role may not fence the job (schema 3).
pub const NOT_PERMITTED_SQLSTATE: &str = "SF002";

/// The SQLSTATE `<p>fence()` raises for a token the controller never issued (schema 3).
pub const NEVER_ISSUED_SQLSTATE: &str = "SF003";

/// The SQLSTATE `<p>fence()` and `<p>attempt()` raise for an attempt that is not its run's newest
/// (a newer attempt registered since, or it never registered), and `<p>fence(job, token)` for a
/// run whose attempts registered (schema 5).
pub const ATTEMPT_SQLSTATE: &str = "SF004";
