//! `kubectl singleton ...`: the kubectl plugin. Parses arguments and calls the library.
use clap::{Parser, Subcommand};
use singleton::plugin::{self, Conn, Output, PluginError};
use singleton::schedule::{DstPolicy, FoldPolicy, GapPolicy, Schedule, preview};

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-singleton",
    bin_name = "kubectl singleton",
    version,
    about = "Inspect and operate SingletonJobs"
)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the next instants of a schedule, exactly as the controller computes them.
    ///
    /// Each line: the instant in RFC 3339 UTC, then the local wall time with its offset.
    Schedule {
        /// Cron expression (5 fields, 6 with seconds, or a macro such as @daily).
        cron: String,
        /// IANA time zone the schedule is read in.
        #[arg(long, default_value = "UTC")]
        time_zone: String,
        /// Print instants strictly after this RFC 3339 instant (default: now).
        #[arg(long)]
        from: Option<jiff::Timestamp>,
        /// How many instants to print.
        #[arg(short = 'n', long, default_value_t = 5)]
        count: usize,
        /// Wall times skipped by a spring-forward change: AfterGap (default) or Shift.
        #[arg(long, default_value = "AfterGap", value_parser = parse_gap)]
        gap: GapPolicy,
        /// Wall times repeated by a fall-back change: First (default) or Last.
        #[arg(long, default_value = "First", value_parser = parse_fold)]
        fold: FoldPolicy,
    },
    /// List SingletonJobs: schedule, suspension, active runs, last result, next run, token.
    List {
        #[command(flatten)]
        ns: Namespace,
        /// List SingletonJobs of all namespaces.
        #[arg(short = 'A', long, conflicts_with = "namespace")]
        all_namespaces: bool,
        /// Output format: json or yaml (default: a table).
        #[arg(short = 'o', long, default_value = "table")]
        output: Output,
    },
    /// Show a SingletonJob: spec summary, conditions, active runs, next times, recent history.
    Status {
        name: String,
        #[command(flatten)]
        ns: Namespace,
        /// Output format: json or yaml (default: a summary).
        #[arg(short = 'o', long, default_value = "table")]
        output: Output,
    },
    /// Show every recorded period of a SingletonJob with its outcome, reason, Job and token.
    History {
        name: String,
        #[command(flatten)]
        ns: Namespace,
        /// Output format: json or yaml (default: a table).
        #[arg(short = 'o', long, default_value = "table")]
        output: Output,
    },
    /// Stop new runs (sets spec.suspend=true); active runs continue.
    Suspend {
        name: String,
        #[command(flatten)]
        ns: Namespace,
    },
    /// Let runs start again (sets spec.suspend=false).
    Resume {
        name: String,
        #[command(flatten)]
        ns: Namespace,
    },
}

#[derive(clap::Args, Debug)]
struct Namespace {
    /// Namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
}

fn parse_gap(s: &str) -> Result<GapPolicy, String> {
    match s {
        "AfterGap" => Ok(GapPolicy::AfterGap),
        "Shift" => Ok(GapPolicy::Shift),
        _ => Err(format!(
            "unknown gap policy {s:?}: expected AfterGap or Shift"
        )),
    }
}

fn parse_fold(s: &str) -> Result<FoldPolicy, String> {
    match s {
        "First" => Ok(FoldPolicy::First),
        "Last" => Ok(FoldPolicy::Last),
        _ => Err(format!("unknown fold policy {s:?}: expected First or Last")),
    }
}

fn main() -> std::process::ExitCode {
    match Args::parse().command {
        Cmd::Schedule {
            cron,
            time_zone,
            from,
            count,
            gap,
            fold,
        } => match Schedule::parse(&cron, Some(&time_zone), DstPolicy { gap, fold }) {
            Ok(s) => {
                for line in preview(&s, from.unwrap_or_else(jiff::Timestamp::now), count) {
                    println!("{line}");
                }
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                std::process::ExitCode::from(2)
            }
        },
        cmd => {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: starting the async runtime: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            match rt.block_on(cluster(cmd)) {
                Ok(text) => {
                    print!("{text}");
                    std::process::ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
    }
}

/// The commands that talk to the API server; returns what to print.
async fn cluster(cmd: Cmd) -> Result<String, PluginError> {
    let conn = Conn::infer().await?;
    let ns = |n: Namespace| {
        n.namespace
            .unwrap_or_else(|| conn.default_namespace.clone())
    };
    let now = jiff::Timestamp::now();
    match cmd {
        Cmd::Schedule { .. } => Ok(String::new()),
        Cmd::List {
            ns: n,
            all_namespaces,
            output,
        } => {
            let scope = (!all_namespaces).then(|| ns(n));
            let sjs = conn.list(scope.as_deref()).await?;
            plugin::format_list(&sjs, all_namespaces, output, now)
        }
        Cmd::Status {
            name,
            ns: n,
            output,
        } => {
            let sj = conn.get(&ns(n), &name).await?;
            plugin::format_status(&sj, output, now)
        }
        Cmd::History {
            name,
            ns: n,
            output,
        } => {
            let sj = conn.get(&ns(n), &name).await?;
            plugin::format_history(&sj, output)
        }
        Cmd::Suspend { name, ns: n } => conn.set_suspend(&ns(n), &name, true).await,
        Cmd::Resume { name, ns: n } => conn.set_suspend(&ns(n), &name, false).await,
    }
}
