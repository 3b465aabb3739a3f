//! How MariaDB/MySQL errors are sorted into the crate's, as PostgreSQL's are: retryable outages
//! (`BackstopUnavailable`), a workload holding the fence row (`FenceHeld`), settings to fix
//! (`BackstopConfig`), and the rest (`Backstop`).

use std::error::Error as _;

use mysql_async::{DriverError, ServerError};

use crate::Error;
use crate::backstop::server_words;

/// `ER_LOCK_WAIT_TIMEOUT`: `innodb_lock_wait_timeout` ended a wait for a row lock.
pub(super) const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// `ER_DUP_ENTRY`: a unique key already has the value.
pub(super) const DUPLICATE_KEY: u16 = 1062;

/// Server errors a retry may cure: deadlock, lock wait, too many connections, shutdown, a
/// statement ended by its time bound, a server gone read-only (a failover).
fn retryable(code: u16) -> bool {
    matches!(
        code,
        1213 | 1205 | 1040 | 1053 | 1077 | 1927 | 1969 | 3024 | 1290 | 1836 | 2006 | 2013
    )
}

impl Error {
    /// Sorts a driver error of an established session.
    pub(crate) fn from_mysql(err: mysql_async::Error) -> Self {
        match err {
            mysql_async::Error::Server(server) => from_server(&server),
            other => Error::BackstopUnavailable(chain(&other)),
        }
    }

    /// Sorts an error while connecting. The server's words are replaced by a fixed text: they
    /// quote the user, host and database taken from the Secret.
    pub(crate) fn from_mysql_connecting(err: mysql_async::Error) -> Self {
        match err {
            mysql_async::Error::Server(s) => {
                let what = match s.code {
                    1045 | 1698 => "authentication failed: check the user and password",
                    1049 => "the database does not exist",
                    1044 | 1142 => "permission denied",
                    1251 => "the server asks for an authentication the driver does not offer",
                    c if retryable(c) => "the server refused the connection",
                    _ => "the server rejected the connection",
                };
                let msg = format!("{what} (error {}, SQLSTATE {})", s.code, s.state);
                if retryable(s.code) {
                    Error::BackstopUnavailable(msg)
                } else {
                    Error::BackstopConfig(msg)
                }
            }
            mysql_async::Error::Driver(DriverError::CleartextPluginDisabled) => {
                Error::BackstopConfig(
                    "the server asks for the password in cleartext (mysql_clear_password), which the controller never sends".into(),
                )
            }
            other => Error::BackstopUnavailable(chain(&other)),
        }
    }
}

fn from_server(s: &ServerError) -> Error {
    let msg = format!(
        "{} (error {}, SQLSTATE {})",
        server_words(&s.message),
        s.code,
        s.state
    );
    match s.code {
        // Not an outage: a run's own transaction holds the fence row (see the PostgreSQL
        // engine's error.rs for why this has its own variant).
        LOCK_WAIT_TIMEOUT => Error::FenceHeld(format!(
            "{msg}: a workload transaction holding the fence row is still open"
        )),
        c if retryable(c) => Error::BackstopUnavailable(msg),
        1044 | 1142 | 1227 | 1370 => Error::BackstopConfig(msg),
        _ => Error::Backstop(msg),
    }
}

/// The error and its sources on one line (the driver's texts name neither host nor user).
fn chain(err: &mysql_async::Error) -> String {
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
    msg
}

/// Whether `err` is the server's duplicate-key refusal (the claim's unique row).
pub(super) fn is_duplicate(err: &mysql_async::Error) -> bool {
    matches!(err, mysql_async::Error::Server(s) if s.code == DUPLICATE_KEY)
}
