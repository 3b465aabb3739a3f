//! The crate's one error type.

use crate::schedule::ScheduleError;

/// Everything that can go wrong in the controller. Variant names double as metric label values.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),

    /// Someone else wrote the object since we read it (HTTP 409): re-read and decide again.
    #[error("lost a compare-and-swap race on {0}")]
    Conflict(String),

    #[error(transparent)]
    Schedule(#[from] ScheduleError),

    #[error("invalid jobTemplate: {0}")]
    JobTemplate(String),

    /// A Job with the run's deterministic name exists but belongs to another run.
    #[error(
        "job {name} exists but is not the run for this period (token {found:?}, expected {expected})"
    )]
    ForeignJob {
        name: String,
        found: Option<u64>,
        expected: u64,
    },

    #[error("serialization: {0}")]
    Serialize(#[from] serde_json::Error),

    #[error("configuration: {0}")]
    Config(String),

    /// This replica may not act (not the leader, or shutting down).
    #[error("not allowed to act: not the leader")]
    NotLeader,

    /// The leader could not renew its Lease within the renew deadline, or saw another holder: it
    /// has stopped acting and the process exits so it restarts as a standby.
    #[error("lost leadership of lease {0}")]
    LeadershipLost(String),

    /// The Lease could not be read or written for a reason other than a lost race (also the
    /// failures an in-memory test lock injects).
    #[error("lease {lease}: {message}")]
    Lease { lease: String, message: String },

    /// The backstop database could not be reached or did not answer in time: retry later; with
    /// `lock.purpose: Correctness` no run starts meanwhile.
    #[error("backstop unavailable: {0}")]
    BackstopUnavailable(String),

    /// The backstop's fence row is locked by an open transaction (a run inside
    /// `singleton_fence`, possibly hung) past the lock timeout. Retryable; under Replace the
    /// run being replaced is stopped first.
    #[error("backstop fence held: {0}")]
    FenceHeld(String),

    /// A fencing token at or below the backstop's stored fence: a newer token exists.
    #[error("stale fencing token {token} for job {job}: current is {current}")]
    StaleToken {
        job: String,
        token: u64,
        current: u64,
    },

    /// The backstop Secret or settings are unusable (missing, unlabelled, malformed). Never
    /// carries a value from the Secret.
    #[error("backstop configuration: {0}")]
    BackstopConfig(String),

    /// An unexpected error from the backstop database.
    #[error("backstop: {0}")]
    Backstop(String),

    /// A run decided as never started has an attempt registered in the backstop: its Job did
    /// run (another replica completed the claim). Its token is not retired and nothing is
    /// recorded; the replica that knows the run records it.
    #[error(
        "the run of job {job} with fencing token {token} has started (attempt {attempt} registered): it is not decided as never run"
    )]
    RunStarted {
        job: String,
        token: u64,
        attempt: String,
    },

    /// Without a backstop to fence it, a replaced run's Job (and so its pods) still exists: the
    /// new run waits for it to be gone (G5). Retried.
    #[error("waiting for the replaced run's Job {0} to be gone before the new run starts")]
    Stopping(String),

    /// The job key belongs to another namespace in the backstop (the namespace of its first
    /// claim; issue 34, N4): this SingletonJob may not claim it or retire its tokens. The owner
    /// is not named here (the message reaches the SingletonJob's readers); the log names it.
    #[error(
        "job key {job} belongs to another namespace in this backstop: use a key of your own, or ask an administrator to share or move it (docs/security.md)"
    )]
    NotOwner { job: String },

    /// Multi-cluster standby: the period is not this cluster's to claim until the database's
    /// clock reaches `until` (`spec.backstop.standbyDelaySeconds`). Retried then.
    #[error("standby: period not claimable here before {until} (database time)")]
    StandbyWaiting { until: jiff::Timestamp },
}

impl Error {
    /// A bounded label for metrics and logs: the variant name, never the message.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "Kube",
            Error::Conflict(_) => "Conflict",
            Error::Schedule(_) => "Schedule",
            Error::JobTemplate(_) => "JobTemplate",
            Error::ForeignJob { .. } => "ForeignJob",
            Error::Serialize(_) => "Serialize",
            Error::Config(_) => "Config",
            Error::NotLeader => "NotLeader",
            Error::LeadershipLost(_) => "LeadershipLost",
            Error::Lease { .. } => "Lease",
            Error::BackstopUnavailable(_) => "BackstopUnavailable",
            Error::FenceHeld(_) => "FenceHeld",
            Error::StaleToken { .. } => "StaleToken",
            Error::BackstopConfig(_) => "BackstopConfig",
            Error::Backstop(_) => "Backstop",
            Error::RunStarted { .. } => "RunStarted",
            Error::Stopping(_) => "Stopping",
            Error::StandbyWaiting { .. } => "StandbyWaiting",
            Error::NotOwner { .. } => "NotOwner",
        }
    }

    /// Whether retrying the same call later may succeed (a backstop that did not answer).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::BackstopUnavailable(_) | Error::FenceHeld(_))
    }

    /// Turns the API server's 409 into [`Error::Conflict`].
    pub fn from_write(err: kube::Error, what: &str) -> Self {
        match &err {
            kube::Error::Api(s) if s.code == 409 => Error::Conflict(what.to_string()),
            _ => Error::Kube(err),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
