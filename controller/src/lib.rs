//! singleton-controller: scheduled Kubernetes Jobs that run at most once per period, each with a
//! fencing token. Binaries are thin; everything lives here.
//!
//! Where to look first: [`run`] is the run protocol (claim, create Job) top to bottom; [`decide`]
//! decides which periods are due; [`schedule`] turns cron + time zone + DST policy into instants.

pub mod api;
pub mod backstop;
pub mod clock;
pub mod conditions;
pub mod controller;
pub mod decide;
pub mod error;
pub mod failpoint;
pub mod kube_io;
pub mod lanes;
pub mod lease;
pub mod memory;
pub mod metrics;
pub mod naming;
pub mod observe;
pub mod ops;
pub mod plugin;
pub mod run;
pub mod schedule;
pub mod telemetry;

pub use error::{Error, Result};
