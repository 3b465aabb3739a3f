//! How PostgreSQL's errors are sorted into the crate's: `BackstopUnavailable` (retryable),
//! `BackstopConfig`, `Backstop`. A claim that finds the period already taken is not an error: it is
//! [`crate::backstop::ClaimOutcome::Duplicate`].

use std::error::Error as _;

use tokio_postgres::error::SqlState;

use crate::Error;
#[cfg(test)]
use crate::backstop::SERVER_WORDS;
use crate::backstop::server_words;

impl Error {
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
                    Error::BackstopUnavailable(msg)
                } else {
                    Error::BackstopConfig(msg)
                };
            }
            let msg = format!("{} (SQLSTATE {})", server_words(db.message()), code.code());
            return match class {
                // Not an outage: a run's own transaction holds the fence row. Who holds it
                // decides what to do (Replace deletes the run it replaces), so it has its own
                // variant rather than "unavailable", which ends in a Missed period.
                _ if *code == SqlState::LOCK_NOT_AVAILABLE => Error::FenceHeld(format!(
                    "{msg}: a workload transaction holding the fence row is still open"
                )),
                _ if retryable => Error::BackstopUnavailable(msg),
                "42" if *code == SqlState::INSUFFICIENT_PRIVILEGE => Error::BackstopConfig(msg),
                _ => Error::Backstop(msg),
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
        Error::BackstopUnavailable(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_words_are_cut_and_printable() {
        assert_eq!(
            server_words("relation \"x\" does not exist"),
            "relation \"x\" does not exist"
        );
        assert_eq!(server_words("a\u{1b}[31mred\nline"), "a[31mred line");
        let long = "é".repeat(SERVER_WORDS + 50);
        let cut = server_words(&long);
        assert_eq!(cut.chars().count(), SERVER_WORDS + 3, "{cut}");
        assert!(cut.ends_with("..."));
    }
}
