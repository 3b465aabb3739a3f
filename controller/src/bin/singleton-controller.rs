//! The controller binary: parses arguments and runs the library.
use std::time::Duration;

use clap::Parser;
use singleton::controller::{self, Gate};

#[derive(Parser, Debug)]
#[command(
    name = "singleton-controller",
    version,
    about = "Runs SingletonJobs exactly once per period"
)]
struct Args {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "SINGLETON_NAMESPACE")]
    namespace: Option<String>,
    /// Name of this instance in Events (the pod name under Kubernetes).
    #[arg(long, env = "POD_NAME")]
    instance: Option<String>,
    /// Largest tolerated difference between this machine's clock and the API server's, in
    /// seconds; beyond it no run starts.
    #[arg(long, env = "SINGLETON_MAX_CLOCK_SKEW_SECONDS", default_value_t = 5)]
    max_clock_skew_seconds: u32,
    /// Seconds between two comparisons of the clocks.
    #[arg(long, env = "SINGLETON_CLOCK_CHECK_SECONDS", default_value_t = 30)]
    clock_check_seconds: u32,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, env = "SINGLETON_LOG_JSON")]
    log_json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    singleton::telemetry::init_logging(args.log_json);
    let client = kube::Client::try_default().await?;
    let cfg = controller::Config {
        namespace: args.namespace,
        reporter: "singleton-controller".into(),
        instance: args.instance,
        max_clock_skew: jiff::SignedDuration::from_secs(args.max_clock_skew_seconds.into()),
        clock_check_interval: Duration::from_secs(args.clock_check_seconds.max(1).into()),
    };
    controller::run(
        client,
        cfg,
        Gate::always(),
        singleton::telemetry::shutdown_signal(),
    )
    .await?;
    Ok(())
}
