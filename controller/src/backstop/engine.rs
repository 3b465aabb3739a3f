//! The engines a backstop can be (one folder each), and the one place that dispatches to them.
//!
//! [`super::Backstop`] holds what every engine shares (the operation timeout, the meter, the
//! scrubbing of Secret values from errors, token arithmetic) and calls its engine for the
//! statements. Each engine implements the same operations with the same meaning, documented on
//! the `Backstop` method of the same name: its own SQL, schema and connection, and the
//! refusals of [`super::refusals`] raised by its fence. Adding an engine: a folder beside
//! `postgres/` with those methods, a variant here, and its arm in [`engine!`].

use super::mysql::Mysql;
use super::postgres::Postgres;

/// The database behind one backstop.
pub(crate) enum Engine {
    /// PostgreSQL 13 or later (`spec.backstop.postgres`). Each engine is boxed: they differ a lot
    /// in size, and a backstop holds one.
    Postgres(Box<Postgres>),
    /// MariaDB 10.6 or later, or MySQL 8.0.16 or later (`spec.backstop.mysql`).
    Mysql(Box<Mysql>),
}

/// A column of the fence row that an engine's `fence_column` reads.
#[derive(Clone, Copy)]
pub(crate) enum FenceColumn {
    /// The highest token issued.
    Token,
    /// The highest token retired.
    Retired,
}

/// Runs `$body` with `$e` bound to the backstop's engine, whichever it is: every engine has
/// the same methods (names, arguments, results), so each arm is the same expression.
macro_rules! engine {
    ($backstop:expr, $e:ident => $body:expr) => {
        match &$backstop.engine {
            $crate::backstop::engine::Engine::Postgres($e) => $body,
            $crate::backstop::engine::Engine::Mysql($e) => $body,
        }
    };
}
pub(crate) use engine;
