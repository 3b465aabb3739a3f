//! The controller binary: parses arguments and runs the library.
use std::time::Duration;

use clap::Parser;
use singleton::api::NotifyTarget;
use singleton::backstop::AllowedHosts;
use singleton::endpoints::{MetricsAuth, MetricsOptions};
use singleton::lease::{self, ElectionConfig};
use singleton::replica::{self, ElectionOptions, ReplicaOptions};
use singleton::{notify, watch};

#[derive(Parser, Debug)]
#[command(
    name = "singleton-controller",
    version,
    about = "Runs SingletonJobs exactly once per period",
    // A later flag wins over an earlier one (test harnesses prepend defaults).
    args_override_self = true
)]
struct Args {
    /// Watch only this namespace (default, or empty: all namespaces).
    #[arg(long, env = "SINGLETON_NAMESPACE")]
    namespace: Option<String>,
    /// Name of this instance in Events (the pod name under Kubernetes).
    #[arg(long, env = "POD_NAME")]
    instance: Option<String>,
    /// Largest tolerated difference between this machine's clock and the API server's, in
    /// seconds; beyond it no run starts.
    #[arg(long, env = "SINGLETON_MAX_CLOCK_SKEW_SECONDS", default_value_t = 5)]
    max_clock_skew_seconds: u32,
    /// How old, in seconds, a comparison of the clocks may be when a run starts (the API server's
    /// responses refresh it; at rest nothing is sent).
    #[arg(long, env = "SINGLETON_CLOCK_CHECK_SECONDS", default_value_t = 30)]
    clock_check_seconds: u32,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, env = "SINGLETON_LOG_JSON")]
    log_json: bool,
    /// Elect one acting replica through a Lease (`--leader-elect=false`: single-replica mode,
    /// this process always acts; never run two replicas so).
    #[arg(long, env = "SINGLETON_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    leader_elect: bool,
    /// Name of the Lease (the Helm release name).
    #[arg(
        long,
        env = "SINGLETON_LEASE_NAME",
        default_value = "singleton-controller"
    )]
    lease_name: String,
    /// Namespace of the Lease (default: --namespace if set, else `default`).
    #[arg(long, env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    /// How long standbys wait, after last seeing the Lease change, before taking it over.
    #[arg(long, env = "SINGLETON_LEASE_DURATION_SECONDS", default_value_t = 15.0)]
    lease_duration_seconds: f64,
    /// How long the leader keeps acting without a successful renewal (< lease duration).
    #[arg(long, env = "SINGLETON_RENEW_DEADLINE_SECONDS", default_value_t = 10.0)]
    renew_deadline_seconds: f64,
    /// How often candidates retry (renew deadline > 1.2 × this).
    #[arg(long, env = "SINGLETON_RETRY_PERIOD_SECONDS", default_value_t = 2.0)]
    retry_period_seconds: f64,
    /// Serve only the SingletonJobs with these labels, a label selector such as `team=payments`
    /// (default: all). Lets controllers share a cluster by label.
    #[arg(long, env = "SINGLETON_LABEL_SELECTOR")]
    label_selector: Option<String>,
    /// Hosts a backstop may point at, comma-separated: CIDRs (`10.0.0.0/8`), addresses and host
    /// names (default: any). A host outside is refused before any connection is attempted.
    #[arg(long, env = "SINGLETON_BACKSTOP_ALLOWED_HOSTS", value_delimiter = ',')]
    backstop_allowed_hosts: Vec<String>,
    /// This cluster's identity, recorded in the claims it writes to a backstop database shared
    /// with other clusters (docs/multi-cluster.md): one per cluster, the same for all replicas.
    /// Empty: single-cluster; such claims are never taken over.
    #[arg(long, env = "SINGLETON_CLUSTER_ID", default_value = "", value_parser = parse_cluster_id)]
    cluster_id: String,
    /// Notification targets for the SingletonJobs without `spec.notify`, as JSON: a list shaped
    /// like `spec.notify` (docs/notifications.md). Their Secrets are read in the controller's
    /// own namespace (`POD_NAMESPACE`). Default: none.
    #[arg(long, env = "SINGLETON_DEFAULT_NOTIFY", value_parser = parse_default_notify)]
    default_notify: Option<DefaultNotify>,
    /// Prepare each run this many seconds before its instant (0 to 3600; 0: never): claimed, its
    /// Job created suspended and confirmed ahead, then started at the instant by one request.
    /// A SingletonJob's `spec.prepareLeadSeconds` overrides it. Not used for SingletonJobs whose
    /// backstop is shared by several clusters. 30 s: a burst of a few hundred runs is prepared
    /// in time at a local API server's rate (a larger burst raises its own lead).
    #[arg(long, env = "SINGLETON_PREPARE_LEAD_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(0..=3600))]
    prepare_lead_seconds: u32,
    /// The longest lead a burst of runs due at one instant may get (0 to 3600, not below
    /// --prepare-lead-seconds): the lead is raised to prepare them all in time at the rate the
    /// API server sustains; a SingletonJob's own longer lead is kept.
    #[arg(long, env = "SINGLETON_PREPARE_MAX_LEAD_SECONDS", default_value_t = 600,
          value_parser = clap::value_parser!(u32).range(0..=3600))]
    prepare_max_lead_seconds: u32,
    /// Address of /healthz and /readyz (plain HTTP, no authentication).
    #[arg(long, env = "SINGLETON_HEALTH_ADDR", default_value = "0.0.0.0:8080")]
    health_addr: std::net::SocketAddr,
    /// Address of /metrics.
    #[arg(long, env = "SINGLETON_METRICS_ADDR", default_value = "0.0.0.0:8443")]
    metrics_addr: std::net::SocketAddr,
    /// Who may read /metrics: `kubernetes` (HTTPS; the caller's bearer token is checked with a
    /// TokenReview and must be allowed `get` on the non-resource URL /metrics by a
    /// SubjectAccessReview) or `none` (plain HTTP, anyone who can connect: for loopback only).
    #[arg(long, env = "SINGLETON_METRICS_AUTH", default_value = "kubernetes")]
    metrics_auth: MetricsAuth,
    /// PEM certificate (chain) for /metrics, e.g. from a cert-manager Secret; re-read when it
    /// changes. Without it a self-signed certificate is made at start-up.
    #[arg(
        long,
        env = "SINGLETON_METRICS_CERT_FILE",
        requires = "metrics_key_file"
    )]
    metrics_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of --metrics-cert-file.
    #[arg(
        long,
        env = "SINGLETON_METRICS_KEY_FILE",
        requires = "metrics_cert_file"
    )]
    metrics_key_file: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    args.namespace = args.namespace.filter(|ns| !ns.is_empty());
    singleton::telemetry::init_logging(args.log_json);
    // The controller's own namespace: the Lease's, and that of the default targets' Secrets.
    let home = args
        .lease_namespace
        .or_else(|| args.namespace.clone())
        .unwrap_or_else(|| "default".into());
    let election = if args.leader_elect {
        Some(ElectionOptions {
            lease_namespace: home.clone(),
            lease_name: args.lease_name,
            config: ElectionConfig::from_secs(
                lease::identity(args.instance.as_deref()),
                args.lease_duration_seconds,
                args.renew_deadline_seconds,
                args.retry_period_seconds,
            )?,
        })
    } else {
        None
    };
    watch::check_prepare_leads(args.prepare_lead_seconds, args.prepare_max_lead_seconds)?;
    let clock = singleton::clock::Samples::new(jiff::SignedDuration::from_secs(
        args.max_clock_skew_seconds.into(),
    ));
    let client = clock.client().await?;
    let notify = notify::Defaults {
        targets: args.default_notify.map(|d| d.0).unwrap_or_default(),
        namespace: home,
    };
    let cfg = watch::Config {
        namespace: args.namespace,
        reporter: "singleton-controller".into(),
        instance: args.instance,
        clock,
        clock_check_interval: Duration::from_secs(args.clock_check_seconds.max(1).into()),
        label_selector: args.label_selector.filter(|s| !s.trim().is_empty()),
        backstop_allowed_hosts: AllowedHosts::parse(&args.backstop_allowed_hosts)?,
        cluster_id: args.cluster_id,
        notify,
        prepare_lead_seconds: args.prepare_lead_seconds,
        prepare_max_lead_seconds: args.prepare_max_lead_seconds,
    };
    let opts = ReplicaOptions {
        election,
        health_addr: args.health_addr,
        metrics: MetricsOptions {
            addr: args.metrics_addr,
            auth: args.metrics_auth,
            cert: args.metrics_cert_file.zip(args.metrics_key_file),
        },
    };
    // Err(LeadershipLost) exits non-zero: the Deployment restarts this pod as a standby.
    replica::run_replica(client, cfg, opts, singleton::telemetry::shutdown_signal()).await?;
    Ok(())
}

/// `--default-notify`'s targets, checked as the CRD checks `spec.notify`.
#[derive(Clone, Debug)]
struct DefaultNotify(Vec<NotifyTarget>);

fn parse_default_notify(s: &str) -> Result<DefaultNotify, String> {
    let targets: Vec<NotifyTarget> = serde_json::from_str(s)
        .map_err(|e| format!("a JSON list of notification targets, as spec.notify: {e}"))?;
    for (i, t) in targets.iter().enumerate() {
        t.check()?;
        if targets[..i].iter().any(|u| u.name == t.name) {
            return Err(format!("notify target name {} given twice", t.name));
        }
    }
    Ok(DefaultNotify(targets))
}

/// A cluster identity: at most 63 characters of `[A-Za-z0-9._-]` (it goes into status, Events,
/// logs and a metric label).
fn parse_cluster_id(s: &str) -> Result<String, String> {
    let ok = s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(s.to_string())
    } else {
        Err("a cluster id is at most 63 characters of letters, digits, '.', '_' and '-'".into())
    }
}
