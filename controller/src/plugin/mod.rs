//! `kubectl singleton schedule|convert|list|status|history|suspend|resume|trigger|backfill|
//! rerun|break-lock`: the plugin's commands against the API server, and the pure rendering of
//! SingletonJobs to text (tested without a cluster). The operations (trigger, backfill, rerun,
//! break-lock) only ask: they write a request annotation and wait for the controller to record
//! what it did (see [`crate::decide::ops`]).
//!
//! - [`client`]: talking to the cluster: reading SingletonJobs, suspending and resuming them.
//! - [`operate`]: asking for an operation and waiting for the controller's record of it.
//! - [`preview`]: `schedule`: a schedule's next instants, streamed, with a cap.
//! - [`convert`]: `convert`: the SingletonJob a CronJob becomes, and what behaves differently.
//! - [`switch`]: `convert --apply`: the switch from the CronJob, neither dropping nor doubling a
//!   period.
//! - [`render`]: what the commands print: tables, the `status` summary, JSON and YAML.
//! - [`error`]: what can go wrong, each message saying what to do about it.

pub mod client;
pub mod convert;
pub mod error;
pub mod operate;
pub mod preview;
pub mod render;
pub mod switch;

pub use client::Cluster;
pub use error::PluginError;
pub use operate::{Wait, new_request};
pub use render::{
    Output, STATUS_HISTORY, age, format_history, format_list, format_operation, format_status,
    render_history, render_list, render_status, table,
};

#[cfg(test)]
mod fixtures;
