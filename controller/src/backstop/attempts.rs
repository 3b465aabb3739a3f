//! Attempts and holders (schema 5, issue 31): what the controller reads and does about the pods of
//! a run in the backstop. The workload's side (`<p>attempt()` and the three-argument
//! `<p>fence()`) is SQL in [`super::schema`]; see docs/fencing.md.
//!
//! - [`Backstop::attempts`]: the attempts of a run that registered, in order (status, tests).
//! - [`Backstop::retire_unstarted`]: retires the token of a run decided without a Job, unless an
//!   attempt of it registered: then a Job of that token did run, and "decided without a Job" is
//!   a stale replica's mistake (F4), refused inside the database.
//! - [`Backstop::withdraw`]: moves a claim whose run never started into `<p>withdrawn_claims`
//!   with the reason (one of [`withdrawal`]'s), and retires its token (schema 9).
//! - [`Backstop::fence_holders`] and [`Backstop::end_fence_holders`]: the sessions holding a job's
//!   fence in an open transaction (a workload on a dead node), and ending them (break-lock, F6).

use jiff::Timestamp;

use super::engine::engine;
use super::{Backstop, to_i64};
use crate::{Error, Result};

/// Why a claim was withdrawn: the `reason` [`Backstop::withdraw`] records in
/// `<p>withdrawn_claims` beside the moved row, for the operator reading the archive. At most
/// [`withdrawal::MAX_REASON`] ASCII characters. A prepared run's withdrawal passes the name of
/// its `WithdrawReason` (docs/design/prepared-runs.md 3.1: `Suspended`, `ScheduleChanged`, ...)
/// the same way.
pub mod withdrawal {
    /// F10c: the period was decided without a Job while the backstop did not answer in the
    /// middle of its claim (`status.unsettledClaims`, settled by `run::decided::settle`); the
    /// row, if the claim committed, names a Job that never existed.
    pub const BACKSTOP_OUTAGE: &str = "BackstopOutage";

    /// The longest reason the archive takes (MariaDB/MySQL's column is `VARCHAR(64)`).
    pub const MAX_REASON: usize = 64;
}

/// One registered attempt of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptRow {
    /// 1 for the first attempt of the run, then 2, ...
    pub seq: i32,
    /// The attempt's id: its pod's uid (`SINGLETON_ATTEMPT`).
    pub attempt: String,
    /// When it registered, by the database's clock.
    pub registered_at: Timestamp,
}

/// A database session holding a job's fence (inside a fenced transaction or a registration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: i32,
    /// The session's login role, application name and client address, for the operator.
    pub role: String,
    pub application: String,
    pub client: String,
    /// Since when its transaction is open.
    pub since: Option<Timestamp>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} (role {}", self.pid, self.role)?;
        if !self.application.is_empty() {
            write!(f, ", application {}", self.application)?;
        }
        if !self.client.is_empty() {
            write!(f, ", client {}", self.client)?;
        }
        if let Some(since) = self.since {
            write!(f, ", transaction open since {since}")?;
        }
        write!(f, ")")
    }
}

/// What became of one holder that [`Backstop::end_fence_holders`] tried to end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    pub holder: Holder,
    /// Ok: its session was terminated (its transaction rolled back); Err: why it could not be
    /// (typically: the controller's role may not signal that role's sessions).
    pub result: std::result::Result<(), String>,
}

impl Backstop {
    /// The attempts that registered for `job`'s run with `token`, oldest first.
    pub async fn attempts(&self, job: &str, token: u64) -> Result<Vec<AttemptRow>> {
        let token = to_i64(token)?;
        self.bounded("read attempts", async {
            engine!(self, e => e.attempts(job, token).await)
        })
        .await
    }

    /// Retires `token` of `job` for a period decided without a Job (rejected, name taken,
    /// missed), unless an attempt of that token registered: then a Job with the token ran (a
    /// replica that paused past its Lease decided the claim another replica had completed), and
    /// retiring would fence out a live run ([`crate::Error::RunStarted`]). The check and the
    /// retirement happen under the fence row's lock, which every registration takes: a
    /// registration either precedes the check (and is seen) or follows the retirement (and is
    /// refused). Idempotent; a token already below the fence or retired changes nothing.
    pub async fn retire_unstarted(&self, job: &str, token: u64, namespace: &str) -> Result<()> {
        to_i64(token)?;
        self.bounded("retire unstarted token", async {
            engine!(self, e => e.retire_unstarted(job, token, namespace).await)
        })
        .await
    }

    /// Withdraws the claim of (`job`, `period`) with `token`, whose run never started: its row,
    /// if it exists and still names that token, moves from `<p>claims` into
    /// `<p>withdrawn_claims` with `reason` (one of [`withdrawal`]'s), and the token is retired.
    /// The period can then be claimed again with a higher token (a normal claim, not a
    /// duplicate), while the retired token is refused by the fence. One transaction under the
    /// fence row's lock, which every registration takes: refused ([`Error::RunStarted`]), moving
    /// nothing, if an attempt of the token registered (the run did start). Idempotent: a second
    /// call finds no row to move and archives nothing twice.
    /// Refused ([`Error::NotOwner`]) when the job key belongs to a namespace other than
    /// `namespace` (empty: not checked): a planted `unsettledClaims` entry must not withdraw
    /// another tenant's claim.
    pub async fn withdraw(
        &self,
        job: &str,
        period: Timestamp,
        token: u64,
        namespace: &str,
        reason: &str,
    ) -> Result<()> {
        to_i64(token)?;
        if reason.is_empty() || reason.len() > withdrawal::MAX_REASON || !reason.is_ascii() {
            return Err(Error::Backstop(format!(
                "withdrawal reason {reason:?}: 1 to {} ASCII characters expected",
                withdrawal::MAX_REASON
            )));
        }
        self.bounded("withdraw claim", async {
            engine!(self, e => e.withdraw(job, period, token, namespace, reason).await)
        })
        .await
    }

    /// The sessions holding `job`'s fence now: each fenced transaction and registration holds a
    /// shared advisory lock keyed by the job (schema 5) until it ends. Empty before schema 5's
    /// functions are in use.
    pub async fn fence_holders(&self, job: &str) -> Result<Vec<Holder>> {
        self.bounded("read fence holders", async {
            engine!(self, e => e.fence_holders(job).await)
        })
        .await
    }

    /// Ends the sessions holding `job`'s fence (`pg_terminate_backend`): their open transactions
    /// roll back, so nothing they wrote commits, and the fence row is free. Each holder is tried
    /// on its own: PostgreSQL lets the controller's role end only sessions of roles it is a
    /// member of (or with `pg_signal_backend`); the others are reported with the reason.
    pub async fn end_fence_holders(&self, job: &str) -> Result<Vec<Ended>> {
        let holders = self.fence_holders(job).await?;
        let mut ended = Vec::with_capacity(holders.len());
        for holder in holders {
            let pid = holder.pid;
            let result = self
                .bounded("end fence holder", async {
                    engine!(self, e => e.end_holder(pid).await)
                })
                .await?;
            ended.push(Ended { holder, result });
        }
        Ok(ended)
    }
}

#[cfg(test)]
mod tests;
