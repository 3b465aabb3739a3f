//! `kubectl singleton ...`: the kubectl plugin. Parses arguments and calls the library.
use clap::{Parser, Subcommand};
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
    }
}
