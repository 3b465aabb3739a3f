//! Test harness for end-to-end tests against a real API server (`make up`).
//!
//! Each test gets its own namespace labelled `singleton.dev/e2e=true`, runs its own controller
//! process restricted to that namespace, polls with deadlines (never a fixed sleep to wait for a
//! condition), and on failure prints what it last saw: the SingletonJob, its Jobs, Events and the
//! controller's log.

pub use singleton;

pub mod chaos;
pub mod observer;
mod backstop;
mod commands;
mod env;
mod http;
mod manifest;
mod markdown;
pub mod multicluster;
pub mod ports;
pub mod prepared_runs;
mod proxy;
pub mod real_node;
pub mod receiver;
mod service_account;
pub mod sim_pods;
pub mod skew;
mod tls;

pub use backstop::{
    backstop_secret, backstop_spec, database_port, database_url, mariadb, mariadb_port,
    mariadb_url, mysql_backstop_spec, mysql_datetime, mysql_timestamp, pg, proxied_backstop_secret,
    table_prefix,
};
pub use commands::{
    chart_dir, helm, kubectl, kubectl_stdin, plugin, plugin_bin, repo_file, run_ok, stderr, stdout,
    yaml_docs,
};
pub use env::{
    Controller, Env, FAST_ELECTION, RUN_LABEL, STEADY_ELECTION, clock_offset_under, controller_bin,
    ensure, events_with_reason, skewed_clock,
};
pub use http::{HttpResponse, health_addr_in, http_get, https_get, metric, metrics_addr_in};
pub use manifest::{DEPTH, never_scheduled, once_at, periods, poisoned, sj_yaml, token_of};
pub use markdown::{ShBlock, sh_blocks};
pub use observer::Observer;
pub use proxy::Proxy;
pub use service_account::{can_i, client_from_kubeconfig};
