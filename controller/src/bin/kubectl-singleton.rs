//! `kubectl singleton ...`: the kubectl plugin. Parses arguments and calls the library.
use clap::{Parser, Subcommand};
use singleton::decide::ops::{OperationKind, Request};
use singleton::plugin::preview::{job_preview, write_lines, write_preview};
use singleton::plugin::{self, Cluster, Output, PluginError, Wait};
use singleton::schedule::{DstPolicy, FoldPolicy, GapPolicy, Schedule};

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

/// `rerun --only`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Only {
    /// Periods whose latest run failed (or was replaced before it finished).
    Failed,
    /// Periods that never ran.
    Missed,
    /// Every decided period whose run is not active.
    All,
}

impl From<Only> for singleton::api::RepairOnly {
    fn from(o: Only) -> Self {
        match o {
            Only::Failed => Self::Failed,
            Only::Missed => Self::Missed,
            Only::All => Self::All,
        }
    }
}

/// `rerun --order`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Order {
    Oldest,
    Newest,
}

impl From<Order> for singleton::api::RepairOrder {
    fn from(o: Order) -> Self {
        match o {
            Order::Oldest => Self::Oldest,
            Order::Newest => Self::Newest,
        }
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the next instants of a schedule, exactly as the controller computes them.
    ///
    /// Each line: the instant in RFC 3339 UTC, then the local wall time with its offset. For
    /// sj/NAME, the SingletonJob's periods: its schedules, with excluded days (its own and its
    /// SingletonCalendars') marked "skipped (excluded day)" or moved to the next allowed day, and
    /// "starts" and the start instant where jitterSeconds delays it.
    Schedule {
        /// Cron expression (5 fields, 6 with seconds, a macro such as @daily, or @every 15m), or
        /// sj/NAME for a SingletonJob in the cluster.
        cron: String,
        /// IANA time zone the schedule is read in (a SingletonJob's own is used for sj/NAME).
        #[arg(long, default_value = "UTC")]
        time_zone: String,
        /// Namespace of sj/NAME (default: the kubeconfig context's).
        #[arg(long)]
        namespace: Option<String>,
        /// Print instants strictly after this RFC 3339 instant (default: now).
        #[arg(long)]
        from: Option<jiff::Timestamp>,
        /// How many instants to print (at most 100000).
        #[arg(short = 'n', long, default_value = "5", value_parser = singleton::plugin::preview::parse_count)]
        count: usize,
        /// Wall times skipped by a spring-forward change: AfterGap (default) or Shift.
        #[arg(long, default_value = "AfterGap", value_parser = parse_gap)]
        gap: GapPolicy,
        /// Wall times repeated by a fall-back change: First (default) or Last.
        #[arg(long, default_value = "First", value_parser = parse_fold)]
        fold: FoldPolicy,
    },
    /// Print the SingletonJob that does what a CronJob does, with what behaves differently.
    ///
    /// With --apply, switch over: suspend the CronJob and create the SingletonJob between two
    /// periods, so the next period runs once, from the SingletonJob. Safe to repeat.
    Convert {
        /// The CronJob, as cronjob/NAME (or NAME).
        cronjob: String,
        #[command(flatten)]
        ns: Namespace,
        /// Suspend the CronJob and create the SingletonJob, instead of printing it.
        #[arg(long)]
        apply: bool,
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
    ///
    /// With --until, the controller resumes it by itself at that instant, and every period due
    /// before then is recorded Skipped (reason Suspended, with --reason), never started late.
    /// --until and --reason are kept in spec.suspension with who asked.
    Suspend {
        name: String,
        /// When to resume by itself (RFC 3339, e.g. 2027-01-03T00:00:00+01:00); in the future.
        #[arg(long)]
        until: Option<jiff::Timestamp>,
        /// Why, for people and the history: "finance freeze".
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        ns: Namespace,
    },
    /// Let runs start again (sets spec.suspend=false, removes spec.suspension).
    Resume {
        name: String,
        #[command(flatten)]
        ns: Namespace,
    },
    /// Run now, outside the schedule: a manual period with its own fencing token.
    ///
    /// The controller starts it through the same claim as scheduled runs; it waits while another
    /// run is active (unless concurrencyPolicy is Allow) and never replaces one.
    Trigger {
        name: String,
        #[command(flatten)]
        ns: Namespace,
        #[command(flatten)]
        op: OpArgs,
    },
    /// Run the scheduled periods of a past range that have not run, each once, oldest first.
    ///
    /// Needs spec.backstop: its claims table is what knows every period that ever ran. Periods
    /// that ran before are counted and skipped, so repeating a backfill starts nothing new.
    Backfill {
        name: String,
        /// First instant of the range (RFC 3339, e.g. 2026-11-01T00:00:00Z).
        #[arg(long)]
        from: jiff::Timestamp,
        /// Last instant of the range, inclusive (RFC 3339).
        #[arg(long)]
        to: jiff::Timestamp,
        /// Wait until every period of the range is done, not only until the backfill is accepted.
        #[arg(long)]
        wait: bool,
        /// Also run periods before the SingletonJob was created. Only if you know they never ran:
        /// an earlier SingletonJob of the same name, or another scheduler (a CronJob being
        /// replaced), may have run them without a claim row. Recorded with who asked.
        #[arg(long)]
        before_creation: bool,
        #[command(flatten)]
        ns: Namespace,
        #[command(flatten)]
        op: OpArgs,
    },
    /// Run a decided period again (--period), or repair a range (--from --to), each period with
    /// a new fencing token that fences the earlier run out.
    ///
    /// The re-run gets the period's SINGLETON_PERIOD and SINGLETON_IDEMPOTENCY_KEY, a token above
    /// every token issued before (in the backstop the period's claim moves to it, so the earlier
    /// run's writes are refused by singleton_fence), and a Job of its own, named after the period
    /// and the token (NAME-SECONDS-rTOKEN). --period: refused while the period's run is active,
    /// unless --replace; refused for a period the schedule has not decided (use trigger or
    /// backfill).
    ///
    /// --from --to: every decided period of the range whose records match --only (failed: its
    /// latest run failed; missed: it never ran; all), in --order, at most --parallel at a time;
    /// a period whose run is active is passed. Needs spec.backstop (each period's claim and
    /// outcome). --dry-run prints exactly what would be re-run now and runs nothing; repeating
    /// a repair with the same range and --only starts nothing new.
    Rerun {
        name: String,
        /// The period to run again: a scheduled instant (RFC 3339, as kubectl singleton history
        /// shows it).
        #[arg(long, required_unless_present = "from", conflicts_with_all = ["from", "to"])]
        period: Option<jiff::Timestamp>,
        /// If the period's run is still active, fence it out and delete it first (as
        /// concurrencyPolicy Replace does) instead of refusing (--period only).
        #[arg(long, conflicts_with = "from")]
        replace: bool,
        /// First instant of the range to repair (RFC 3339).
        #[arg(long, requires = "to")]
        from: Option<jiff::Timestamp>,
        /// Last instant of the range to repair, inclusive (RFC 3339).
        #[arg(long, requires = "from")]
        to: Option<jiff::Timestamp>,
        /// Which periods of the range to re-run.
        #[arg(long, value_enum, default_value_t = Only::Failed, requires = "from")]
        only: Only,
        /// Print what would be re-run, run nothing.
        #[arg(long, requires = "from")]
        dry_run: bool,
        /// At most this many of the repair's runs at once (above 1 needs concurrencyPolicy
        /// Allow).
        #[arg(long, default_value_t = 1, requires = "from")]
        parallel: u32,
        /// Which end of the range first.
        #[arg(long, value_enum, default_value_t = Order::Oldest, requires = "from")]
        order: Order,
        /// Wait until the whole range is repaired, not only until the repair is accepted.
        #[arg(long, requires = "from")]
        wait: bool,
        #[command(flatten)]
        ns: Namespace,
        #[command(flatten)]
        op: OpArgs,
    },
    /// Fence out every token issued so far and stop the active runs.
    ///
    /// For a run stuck holding its job: the fencing token is raised in status and in the
    /// backstop's fence, so the old holder's writes are refused; its Job is deleted. Who asked and
    /// why are recorded in status and in a LockBroken Event.
    BreakLock {
        name: String,
        /// Why the lock is broken (recorded in status and in the Event).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        ns: Namespace,
        #[command(flatten)]
        op: OpArgs,
    },
}

#[derive(clap::Args, Debug)]
struct OpArgs {
    /// How long to wait for the controller to act.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    timeout: std::time::Duration,
    /// Output format: json or yaml (default: a line of text).
    #[arg(short = 'o', long, default_value = "table")]
    output: Output,
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let d: jiff::SignedDuration = s
        .parse::<jiff::Span>()
        .map_err(|e| format!("{s:?} is not a duration such as 30s or 2m: {e}"))
        .and_then(|span| jiff::SignedDuration::try_from(span).map_err(|e| format!("{s:?}: {e}")))?;
    std::time::Duration::try_from(d).map_err(|_| format!("{s:?} must not be negative"))
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

/// The name in `sj/NAME` (or `singletonjob/NAME`), if the schedule argument names a SingletonJob.
fn job_name(arg: &str) -> Option<&str> {
    arg.strip_prefix("sj/")
        .or_else(|| arg.strip_prefix("singletonjob/"))
        .or_else(|| arg.strip_prefix("singletonjobs/"))
}

fn main() -> std::process::ExitCode {
    match Args::parse().command {
        Cmd::Schedule {
            cron,
            time_zone,
            namespace: _,
            from,
            count,
            gap,
            fold,
        } if job_name(&cron).is_none() => {
            match Schedule::parse(&cron, Some(&time_zone), DstPolicy { gap, fold }) {
                Ok(s) => {
                    let from = from.unwrap_or_else(jiff::Timestamp::now);
                    match write_preview(&mut std::io::stdout().lock(), &s, from, count) {
                        Ok(()) => std::process::ExitCode::SUCCESS,
                        Err(e) => {
                            eprintln!("error: {e}");
                            std::process::ExitCode::FAILURE
                        }
                    }
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    std::process::ExitCode::from(2)
                }
            }
        }
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
            match rt.block_on(on_cluster(cmd)) {
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
async fn on_cluster(cmd: Cmd) -> Result<String, PluginError> {
    let cluster = Cluster::infer().await?;
    let namespace = |n: Namespace| {
        n.namespace
            .unwrap_or_else(|| cluster.default_namespace.clone())
    };
    let now = jiff::Timestamp::now();
    match cmd {
        // A cron expression runs without a cluster, in main.
        Cmd::Schedule {
            cron,
            namespace: ns,
            from,
            count,
            ..
        } => {
            let name = job_name(&cron).unwrap_or_default();
            let ns = ns.unwrap_or_else(|| cluster.default_namespace.clone());
            let sj = cluster.get(&ns, name).await?;
            let names = sj.spec.exclusions.as_ref().map(|x| x.calendars.clone());
            let calendars = cluster.calendars(&ns, &names.unwrap_or_default()).await?;
            let schedule = singleton::decide::schedule(&sj.spec, &calendars)
                .map_err(|e| PluginError::Usage(format!("{ns}/{name}: {e}")))?;
            let key = sj.backstop_key();
            let lines = job_preview(&sj, &schedule, &key, from.unwrap_or(now), count);
            let mut out = Vec::new();
            write_lines(&mut out, lines).map_err(|e| PluginError::Encode(e.to_string()))?;
            Ok(String::from_utf8_lossy(&out).into_owned())
        }
        Cmd::List {
            ns,
            all_namespaces,
            output,
        } => {
            let scope = (!all_namespaces).then(|| namespace(ns));
            let sjs = cluster.list(scope.as_deref()).await?;
            plugin::format_list(&sjs, all_namespaces, output, now)
        }
        Cmd::Convert { cronjob, ns, apply } => {
            let ns = namespace(ns);
            let name = plugin::convert::cronjob_name(&cronjob)?;
            let cj = cluster.get_cronjob(&ns, name).await?;
            let conversion = plugin::convert::convert(&cj, now)?;
            if apply {
                let switched = cluster.switch(&cj, &conversion).await?;
                Ok(plugin::switch::describe(&switched, &ns, name))
            } else {
                plugin::convert::render(&conversion, &format!("{ns}/{name}"))
            }
        }
        Cmd::Status { name, ns, output } => {
            let sj = cluster.get(&namespace(ns), &name).await?;
            plugin::format_status(&sj, output, now)
        }
        Cmd::History { name, ns, output } => {
            let sj = cluster.get(&namespace(ns), &name).await?;
            plugin::format_history(&sj, output)
        }
        Cmd::Suspend {
            name,
            until,
            reason,
            ns,
        } => {
            let ns = namespace(ns);
            cluster.suspend_until(&ns, &name, until, reason, now).await
        }
        Cmd::Resume { name, ns } => cluster.set_suspend(&namespace(ns), &name, false).await,
        op => ask(&cluster, op, now).await,
    }
}

/// The operations (trigger, backfill, rerun, break-lock): the request each writes; then
/// [`operate`].
async fn ask(cluster: &Cluster, cmd: Cmd, now: jiff::Timestamp) -> Result<String, PluginError> {
    let namespace = |n: Namespace| {
        n.namespace
            .unwrap_or_else(|| cluster.default_namespace.clone())
    };
    match cmd {
        Cmd::Trigger { name, ns, op } => {
            let req = cluster.trigger_request(now).await;
            let kind = OperationKind::Trigger;
            operate(cluster, &namespace(ns), &name, kind, req, op, false).await
        }
        Cmd::Backfill {
            name,
            from,
            to,
            wait,
            before_creation,
            ns,
            op,
        } => {
            let req = cluster
                .backfill_request(from, to, before_creation, now)
                .await?;
            let kind = OperationKind::Backfill;
            operate(cluster, &namespace(ns), &name, kind, req, op, wait).await
        }
        Cmd::Rerun {
            name,
            period,
            replace,
            from,
            to,
            only,
            dry_run,
            parallel,
            order,
            wait,
            ns,
            op,
        } => {
            let ns = namespace(ns);
            if let Some(period) = period {
                let req = cluster.rerun_request(period, replace, now).await;
                let kind = OperationKind::Rerun;
                return operate(cluster, &ns, &name, kind, req, op, false).await;
            }
            let range = from.zip(to).ok_or_else(|| {
                PluginError::Usage("rerun needs --period, or --from and --to".into())
            })?;
            let req = cluster
                .repair_request(range, only.into(), order.into(), parallel, now)
                .await?;
            let kind = match dry_run {
                true => OperationKind::RepairDryRun,
                false => OperationKind::Repair,
            };
            operate(cluster, &ns, &name, kind, req, op, wait).await
        }
        Cmd::BreakLock {
            name,
            reason,
            ns,
            op,
        } => {
            let req = cluster.break_lock_request(reason, now).await?;
            let kind = OperationKind::BreakLock;
            operate(cluster, &namespace(ns), &name, kind, req, op, false).await
        }
        // Not operations: on_cluster runs them.
        _ => Ok(String::new()),
    }
}

/// Asks for the operation, waits for the controller as `op` says, and formats its record.
async fn operate(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    kind: OperationKind,
    req: Request,
    op: OpArgs,
    until_done: bool,
) -> Result<String, PluginError> {
    let wait = Wait {
        timeout: op.timeout,
        until_done,
    };
    let record = cluster.operate(ns, name, kind, req, wait).await?;
    plugin::format_operation(kind, ns, name, &record, op.output)
}
