//! singleton-controller: scheduled Kubernetes Jobs that run at most once per period, each with a
//! fencing token. Binaries are thin; everything lives here. docs/architecture.md has the same
//! map with where each guarantee (G1 to G5) is kept.
//!
//! The flow of a run, and the modules in its order (each imports only those before it):
//!
//! ```text
//! replica  → watch      → reconcile → observe → decide → run: claim → create → confirm → record
//! (lease)    (caches)     (one pass)  (what is)  (pure)        (the run protocol)          (status)
//! ```
//!
//! Where to look first: [`run`] is the run protocol top to bottom; [`decide`] decides which
//! periods are due; [`reconcile`] is one pass over a SingletonJob in the order above.

// The vocabulary: schedules, the API, errors, names. No I/O.
pub mod schedule;
pub mod api;
pub mod error;
pub mod naming;
pub mod sync;
pub mod text;

// Plumbing every step may use.
pub mod failpoint;
pub mod lanes;
pub mod memory;
pub mod metrics;
pub mod telemetry;

// Pure decisions and what a Job is.
pub mod decide;
pub mod job;

// The world outside: the API server's clock, the gate, the backstop database, Events, the
// receivers of notifications.
pub mod backstop;
pub mod clock;
pub mod events;
pub mod gate;
pub mod notify;

// What a reconcile shares, and its gated writes.
pub mod context;
pub mod kube_io;

// One reconcile, in the order of the flow.
pub mod observe;
pub mod record;
pub mod run;
pub mod operate;
// Each watched SingletonJob decoded on its own, and the reconcile of one that does not decode.
pub mod watch_decode;
pub mod reconcile;

// Wiring: the watches, leader election, the probes and one replica's life.
pub mod watch_backoff;
pub mod watch;
pub mod lease;
pub mod endpoints;
pub mod replica;

// The kubectl plugin's library side.
pub mod plugin;

pub use error::{Error, Result};
