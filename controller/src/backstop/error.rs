//! The backstop's errors, and how PostgreSQL's are sorted into them.

use std::error::Error as _;

use tokio_postgres::error::SqlState;

/// What went wrong talking to the backstop database. A claim that finds the period already taken
/// is not an error: it is [`super::ClaimOutcome::Duplicate`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackstopError {
    /// Could not reach the database, or it did not answer in time, or it was busy (lock wait,
    /// serialization failure, shutdown): retry later.
    #[error("backstop database unavailable: {0}")]
    Unavailable(String),

    /// The token is not above the stored fence: a newer token was issued for this job.
    #[error("stale fencing token {token} for job {job}: current is {current}")]
    StaleToken {
        job: String,
        token: u64,
        current: u64,
    },

    /// The Secret's contents, the table prefix or the database's answer to our credentials are
    /// wrong: retrying will not help until someone changes them.
    #[error("backstop configuration: {0}")]
    Config(String),

    /// Anything else (an unexpected SQL error): a bug or a damaged schema.
    #[error("backstop database error: {0}")]
    Other(String),
}

impl BackstopError {
    /// Whether retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, BackstopError::Unavailable(_))
    }

    /// A bounded label for metrics and condition reasons.
    pub fn kind(&self) -> &'static str {
        match self {
            BackstopError::Unavailable(_) => "BackstopUnavailable",
            BackstopError::StaleToken { .. } => "StaleToken",
            BackstopError::Config(_) => "BackstopConfig",
            BackstopError::Other(_) => "Backstop",
        }
    }

    pub(crate) fn timeout(what: &str, after: std::time::Duration) -> Self {
        BackstopError::Unavailable(format!("{what} timed out after {after:?}"))
    }

    /// Sorts a driver error. `connecting` says whether it happened while establishing the
    /// session: the server's words are then replaced by a fixed text, because startup errors
    /// quote the user and database names taken from the Secret.
    pub(crate) fn from_pg(err: tokio_postgres::Error, connecting: bool) -> Self {
        if let Some(db) = err.as_db_error() {
            let code = db.code();
            let class = &code.code()[..2];
            let retryable = matches!(class, "08" | "53" | "57" | "40" | "55" | "58")
                || *code == SqlState::T_R_SERIALIZATION_FAILURE;
            if connecting {
                let what = match class {
                    "28" => "authentication failed: check the user and password",
                    "3D" => "the database does not exist",
                    "42" => "permission denied",
                    _ if retryable => "the server refused the connection",
                    _ => "the server rejected the connection",
                };
                let msg = format!("{what} (SQLSTATE {})", code.code());
                return if retryable {
                    BackstopError::Unavailable(msg)
                } else {
                    BackstopError::Config(msg)
                };
            }
            let msg = format!("{} (SQLSTATE {})", db.message(), code.code());
            return match class {
                _ if *code == SqlState::LOCK_NOT_AVAILABLE => BackstopError::Unavailable(format!(
                    "{msg}: a workload transaction holding the fence row is still open"
                )),
                _ if retryable => BackstopError::Unavailable(msg),
                "42" if *code == SqlState::INSUFFICIENT_PRIVILEGE => BackstopError::Config(msg),
                _ => BackstopError::Other(msg),
            };
        }
        // Not from the server: I/O, TLS, a closed connection. The driver's texts name neither
        // the host nor the user, but the source chain can be long; keep it on one line.
        let mut msg = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            let text = cause.to_string();
            if !msg.contains(&text) {
                msg.push_str(": ");
                msg.push_str(&text);
            }
            source = cause.source();
        }
        BackstopError::Unavailable(msg)
    }
}

impl From<BackstopError> for crate::Error {
    fn from(e: BackstopError) -> Self {
        match e {
            BackstopError::Unavailable(m) => crate::Error::BackstopUnavailable(m),
            BackstopError::StaleToken {
                job,
                token,
                current,
            } => crate::Error::StaleToken {
                job,
                token,
                current,
            },
            BackstopError::Config(m) => crate::Error::BackstopConfig(m),
            BackstopError::Other(m) => crate::Error::Backstop(m),
        }
    }
}
