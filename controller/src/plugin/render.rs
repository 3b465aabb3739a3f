//! What the commands print: kubectl-style tables, the `status` summary, one line for an
//! operation, or the objects as JSON or YAML. Pure functions of what was read, so every format
//! is tested without a cluster.

use std::fmt::Write as _;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::ResourceExt;

use super::error::PluginError;
use crate::api::{
    HistoryEntry, OperationPhase, OperationStatus, Operations, Outcome, RunRef, SingletonJob,
    SingletonJobSpec, SingletonJobStatus,
};
use crate::decide::ops::OperationKind;
use crate::schedule::{DstPolicy, Schedule};
use crate::text;

/// How `list`, `status` and `history` print.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    /// Human tables.
    #[default]
    Table,
    Json,
    Yaml,
}

impl std::str::FromStr for Output {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "table" | "wide" => Ok(Output::Table),
            "json" => Ok(Output::Json),
            "yaml" => Ok(Output::Yaml),
            _ => Err(format!(
                "unknown output format {s:?}: expected json or yaml"
            )),
        }
    }
}

/// `list` output: a table, or a kubectl-style `List` of the objects.
pub fn format_list(
    sjs: &[SingletonJob],
    all_namespaces: bool,
    output: Output,
    now: Timestamp,
) -> Result<String, PluginError> {
    match output {
        Output::Table => Ok(render_list(sjs, all_namespaces, now)),
        _ => encode(
            &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": sjs}),
            output,
        ),
    }
}

/// `status` output: the human summary, or the whole object.
pub fn format_status(
    sj: &SingletonJob,
    output: Output,
    now: Timestamp,
) -> Result<String, PluginError> {
    match output {
        Output::Table => Ok(render_status(sj, now)),
        _ => encode(sj, output),
    }
}

/// `history` output: the table, or the entries (newest first).
pub fn format_history(sj: &SingletonJob, output: Output) -> Result<String, PluginError> {
    let history = sj
        .status
        .as_ref()
        .map(|s| s.history.as_slice())
        .unwrap_or_default();
    match output {
        Output::Table => Ok(render_history(history)),
        _ => encode(&history, output),
    }
}

/// What an operation command prints: one line for humans, or the record.
pub fn format_operation(
    kind: OperationKind,
    ns: &str,
    name: &str,
    op: &OperationStatus,
    output: Output,
) -> Result<String, PluginError> {
    if output != Output::Table {
        return encode(op, output);
    }
    let head = match (kind, op.phase) {
        (OperationKind::Trigger, OperationPhase::Done) => {
            format!("singletonjob {ns}/{name} triggered")
        }
        (OperationKind::BreakLock, OperationPhase::Done) => {
            format!("singletonjob {ns}/{name}: lock broken")
        }
        (OperationKind::Rerun, OperationPhase::Done) => format!("singletonjob {ns}/{name}"),
        (OperationKind::Backfill, OperationPhase::Done) => {
            format!("singletonjob {ns}/{name}: backfill done")
        }
        (OperationKind::Backfill, OperationPhase::Running) => {
            format!("singletonjob {ns}/{name}: backfill accepted")
        }
        (OperationKind::Repair, OperationPhase::Done) => {
            format!("singletonjob {ns}/{name}: repair done")
        }
        (OperationKind::Repair, OperationPhase::Running) => {
            format!("singletonjob {ns}/{name}: repair accepted")
        }
        (OperationKind::RepairDryRun, OperationPhase::Done) => {
            format!("singletonjob {ns}/{name}: dry run")
        }
        (_, _) => format!(
            "singletonjob {ns}/{name}: {} accepted, not done yet",
            kind.command()
        ),
    };
    let mut out = format!(
        "{head}: {} (request {})\n",
        text::printable(&op.message),
        text::printable(&op.id)
    );
    // A dry run lists the periods it would re-run, one per line, in the repair's order.
    if kind == OperationKind::RepairDryRun && op.phase == OperationPhase::Done {
        for p in &op.periods {
            out.push_str(&format!("  {}\n", crate::naming::period_rfc3339(p.0)));
        }
        let listed = op.periods.len() as u64;
        if let Some(more) = op.selected.filter(|n| *n > listed).map(|n| n - listed) {
            out.push_str(&format!(
                "  ... and {more} more (narrow --from/--to to list them)\n"
            ));
        }
    }
    Ok(out)
}

/// `output` as JSON or YAML; a table is not one of them.
fn encode<T: serde::Serialize>(value: &T, output: Output) -> Result<String, PluginError> {
    match output {
        Output::Json => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| PluginError::Encode(e.to_string())),
        Output::Yaml => {
            serde_yaml::to_string(value).map_err(|e| PluginError::Encode(e.to_string()))
        }
        Output::Table => Err(PluginError::Encode("not a structured format".into())),
    }
}

/// The `list` table (with a NAMESPACE column for `-A`).
pub fn render_list(sjs: &[SingletonJob], all_namespaces: bool, now: Timestamp) -> String {
    if sjs.is_empty() {
        return "No SingletonJobs found.\n".into();
    }
    let mut headers = vec![
        "NAME",
        "SCHEDULE",
        "SUSPEND",
        "ACTIVE",
        "LAST RESULT",
        "LAST SCHEDULE",
        "NEXT",
        "PREPARED",
        "TOKEN",
    ];
    if all_namespaces {
        headers.insert(0, "NAMESPACE");
    }
    let rows: Vec<Vec<String>> = sjs
        .iter()
        .map(|sj| {
            let st = sj.status.clone().unwrap_or_default();
            // A stand-in has no spec to show (its status's Ready condition says why).
            let schedule = match crate::watch_decode::undecodable(sj) {
                Some(_) => "(undecodable)".to_string(),
                None => sj.spec.schedule.clone(),
            };
            let mut row = vec![
                sj.name_any(),
                schedule,
                sj.spec.suspend.unwrap_or(false).to_string(),
                st.active_count.to_string(),
                st.last_result.map(outcome).unwrap_or_else(|| "-".into()),
                st.last_schedule_time
                    .as_ref()
                    .map(|t| format!("{} ago", age(t.0, now)))
                    .unwrap_or_else(|| "-".into()),
                dash(st.next_schedule_time.as_deref()),
                st.prepared
                    .as_ref()
                    .map(|r| instant(resume_at(r)))
                    .unwrap_or_else(|| "-".into()),
                st.fencing_token.to_string(),
            ];
            if all_namespaces {
                row.insert(0, sj.namespace().unwrap_or_default());
            }
            row
        })
        .collect();
    table(&headers, &rows)
}

/// How many history entries `status` shows.
pub const STATUS_HISTORY: usize = 10;

/// The `status` summary: spec, conditions, active runs, the run prepared ahead of its instant,
/// next times, recent history, and the operations users asked for.
pub fn render_status(sj: &SingletonJob, now: Timestamp) -> String {
    let st = sj.status.clone().unwrap_or_default();
    [
        summary(sj, &st),
        conditions_section(&st.conditions, now),
        active_runs_section(&st.active),
        prepared_run_section(st.prepared.as_ref(), time_zone(&sj.spec).as_ref(), now),
        next_times_section(&st.next_schedule_times),
        history_section(&st.history),
        operations_section(&st.operations),
    ]
    .concat()
}

/// The head of `status`: what the spec asks for and where the status stands, one aligned
/// `Key: value` line each.
fn summary(sj: &SingletonJob, st: &SingletonJobStatus) -> String {
    let spec = &sj.spec;
    let fields = [
        ("Name", sj.name_any()),
        ("Namespace", sj.namespace().unwrap_or_default()),
        ("Schedule", spec.schedule.clone()),
        (
            "Time Zone",
            spec.time_zone.clone().unwrap_or_else(|| "UTC".into()),
        ),
        (
            "DST Policy",
            format!(
                "gap={:?} fold={:?}",
                spec.dst_policy.gap, spec.dst_policy.fold
            ),
        ),
        ("Catch Up", format!("{:?}", spec.catch_up)),
        ("Concurrency", format!("{:?}", spec.concurrency_policy)),
        (
            "Starting Deadline",
            spec.starting_deadline_seconds
                .map(|s| format!("{s}s"))
                .unwrap_or_else(|| "none".into()),
        ),
        (
            "Lock Purpose",
            format!(
                "{:?}",
                spec.lock.as_ref().map(|l| l.purpose).unwrap_or_default()
            ),
        ),
        ("Backstop", backstop(spec)),
        ("Suspend", suspend(spec)),
        ("Bounds", bounds(spec, st)),
        ("Fencing Token", st.fencing_token.to_string()),
        (
            "Last Result",
            st.last_result.map(outcome).unwrap_or_else(|| "-".into()),
        ),
        ("Last Schedule", opt_ts(st.last_schedule_time.as_ref())),
        ("Last Success", opt_ts(st.last_successful_time.as_ref())),
    ];
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    let mut out = String::new();
    for (k, v) in fields {
        let _ = writeln!(out, "{:<width$} {v}", format!("{k}:"));
    }
    out
}

/// `true`/`false`, with the suspension's end, author and reason when it has them.
fn suspend(spec: &SingletonJobSpec) -> String {
    let on = spec.suspend.unwrap_or(false);
    match spec.suspension.as_ref().filter(|_| on) {
        Some(s) => format!("true ({})", s.note()),
        None => on.to_string(),
    }
}

/// `startAt`, `endAt` and `maxRuns` with the count against it; "none" without any.
fn bounds(spec: &SingletonJobSpec, st: &SingletonJobStatus) -> String {
    let mut parts = Vec::new();
    if let Some(t) = &spec.start_at {
        parts.push(format!("from {}", ts(t)));
    }
    if let Some(t) = &spec.end_at {
        parts.push(format!("to {}", ts(t)));
    }
    if let Some(max) = spec.max_runs() {
        parts.push(format!("{} of maxRuns {max} run", st.run_count));
    }
    if parts.is_empty() {
        return "none".into();
    }
    parts.join(", ")
}

/// Whether the backstop is on, and the Secret it connects with.
fn backstop(spec: &SingletonJobSpec) -> String {
    match spec.backstop.as_ref().and_then(|b| b.database()) {
        Some((crate::api::BackstopKind::Postgres, secret, _)) => {
            format!("on (postgres, secret {})", secret.name)
        }
        Some((crate::api::BackstopKind::Mysql, secret, _)) => {
            format!("on (mysql, secret {})", secret.name)
        }
        None => "off".into(),
    }
}

fn conditions_section(conditions: &[Condition], now: Timestamp) -> String {
    let rows: Vec<Vec<String>> = conditions
        .iter()
        .map(|c| {
            vec![
                c.type_.clone(),
                c.status.clone(),
                dash(Some(&c.reason)),
                age(c.last_transition_time.0, now),
                dash(Some(&c.message)),
            ]
        })
        .collect();
    table_section(
        "Conditions",
        &["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"],
        &rows,
    )
}

fn active_runs_section(active: &[RunRef]) -> String {
    let rows: Vec<Vec<String>> = active
        .iter()
        .map(|r| vec![r.job_name.clone(), period(&r.period), r.token.to_string()])
        .collect();
    table_section("Active Runs", &["JOB", "PERIOD", "TOKEN"], &rows)
}

/// The run prepared ahead of its instant (claimed, its Job created suspended and confirmed):
/// when it is resumed, in the SingletonJob's time zone `tz` (the date too when that is not
/// today there; in UTC, RFC 3339, when the zone is unknown), its token, its Job and period, and
/// how far off the resume is, or how overdue.
fn prepared_run_section(
    prepared: Option<&RunRef>,
    tz: Option<&TimeZone>,
    now: Timestamp,
) -> String {
    let lines = prepared.map(|r| {
        let at = resume_at(r);
        let when = match tz {
            Some(tz) => local(at, tz, now),
            None => instant(at),
        };
        let due = if at > now {
            format!("resumes in {}", age(now, at))
        } else {
            format!("not resumed yet, due {} ago", age(at, now))
        };
        format!(
            "Prepared for {when}, token {}\nJob {} (period {}), {due}\n",
            r.token,
            text::printable(&r.job_name),
            period(&r.period),
        )
    });
    section("Prepared Run", lines)
}

/// When a prepared run is resumed: its `resumeAt`, or its period when it has none.
fn resume_at(r: &RunRef) -> Timestamp {
    r.resume_at.as_ref().unwrap_or(&r.period).0
}

/// The SingletonJob's time zone (`spec.timeZone`, UTC when unset), resolved exactly as its
/// schedule resolves it (the tz database compiled into the binary); None for a name that
/// database does not know (the Ready condition says so). The expression only carries the zone.
fn time_zone(spec: &SingletonJobSpec) -> Option<TimeZone> {
    Schedule::parse("@every 1s", spec.time_zone.as_deref(), DstPolicy::default())
        .ok()
        .map(|s| s.time_zone().clone())
}

/// `t`'s wall time in `tz` (`12:00:00`, with milliseconds when it has any: jitter), preceded
/// by its date there when that is not `now`'s (`2027-01-02 12:00:00`).
fn local(t: Timestamp, tz: &TimeZone, now: Timestamp) -> String {
    let zoned = t.to_zoned(tz.clone());
    let time = if t.subsec_nanosecond() == 0 {
        zoned.strftime("%H:%M:%S").to_string()
    } else {
        zoned.strftime("%H:%M:%S%.3f").to_string()
    };
    if zoned.date() == now.to_zoned(tz.clone()).date() {
        time
    } else {
        format!("{} {time}", zoned.date())
    }
}

/// An instant in RFC 3339 UTC, with milliseconds when it has any (a jittered resume).
fn instant(t: Timestamp) -> String {
    if t.subsec_nanosecond() == 0 {
        t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    } else {
        t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
    }
}

/// The next three instants (status keeps a few more).
fn next_times_section(times: &[Time]) -> String {
    let lines = (!times.is_empty()).then(|| {
        times
            .iter()
            .take(3)
            .map(|t| format!("{}\n", ts(t)))
            .collect()
    });
    section("Next Schedule Times", lines)
}

/// An entry's reason; with the cluster that has the period when it ran in another one
/// (`ClaimedElsewhere (east)`, multi-cluster).
fn reason(h: &HistoryEntry) -> String {
    match (&h.reason, &h.cluster) {
        (Some(r), Some(c)) => format!("{r} ({c})"),
        (r, _) => dash(r.as_deref()),
    }
}

/// The newest [`STATUS_HISTORY`] entries; `history` shows them all.
fn history_section(history: &[HistoryEntry]) -> String {
    let rows: Vec<Vec<String>> = history
        .iter()
        .take(STATUS_HISTORY)
        .map(|h| {
            vec![
                period(&h.period),
                count(h),
                outcome(h.outcome),
                reason(h),
                dash(h.job_name.as_deref()),
                token(h),
            ]
        })
        .collect();
    let title = format!(
        "History (last {} of {}, newest first)",
        rows.len(),
        history.len()
    );
    table_section(
        &title,
        &["PERIOD", "COUNT", "OUTCOME", "REASON", "JOB", "TOKEN"],
        &rows,
    )
}

/// The latest request of each kind and what became of it; nothing at all when none was made.
fn operations_section(ops: &Operations) -> String {
    if ops.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = OperationKind::ALL
        .iter()
        .filter_map(|k| k.slot(ops).map(|o| (k, o)))
        .map(|(k, o)| {
            vec![
                k.command().to_string(),
                format!("{:?}", o.phase),
                dash(o.requested_by.as_deref()),
                opt_ts(o.updated.as_ref()),
                o.message.clone(),
            ]
        })
        .collect();
    table_section(
        "Operations",
        &["OPERATION", "PHASE", "BY", "UPDATED", "MESSAGE"],
        &rows,
    )
}

/// The `history` table: every entry, newest first.
pub fn render_history(history: &[HistoryEntry]) -> String {
    if history.is_empty() {
        return "No history yet.\n".into();
    }
    let rows: Vec<Vec<String>> = history
        .iter()
        .map(|h| {
            vec![
                period(&h.period),
                opt_ts(h.last_period.as_ref()),
                count(h),
                outcome(h.outcome),
                reason(h),
                dash(h.job_name.as_deref()),
                token(h),
                dash(h.requested_by.as_deref()),
                opt_ts(h.start_time.as_ref()),
                opt_ts(h.finish_time.as_ref()),
            ]
        })
        .collect();
    table(
        &[
            "PERIOD",
            "LAST PERIOD",
            "COUNT",
            "OUTCOME",
            "REASON",
            "JOB",
            "TOKEN",
            "BY",
            "START",
            "FINISH",
        ],
        &rows,
    )
}

/// Left-aligned columns separated by three spaces, as kubectl prints them.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    // Cells may hold client-supplied text (who asked, why): one line each, no control characters.
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| text::printable(c)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let header_row: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header_row).chain(&rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 < row.len() {
                let pad = widths.get(i).copied().unwrap_or(0);
                let _ = write!(line, "{cell:<pad$}   ");
            } else {
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A titled section of `status`: its body indented under the title, or `<none>`.
fn section(title: &str, body: Option<String>) -> String {
    match body {
        Some(body) => format!("{title}:\n{}", indent(&body)),
        None => format!("{title}:\n  <none>\n"),
    }
}

/// A section of `status` that is a table (`<none>` when there are no rows).
fn table_section(title: &str, headers: &[&str], rows: &[Vec<String>]) -> String {
    section(title, (!rows.is_empty()).then(|| table(headers, rows)))
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

// The cells: each value as a table shows it, `-` for none.

/// A short age such as `45s`, `3m12s`, `2h5m`, `4d3h` (kubectl's style); `<unknown>` when in
/// the future by more than a second.
pub fn age(then: Timestamp, now: Timestamp) -> String {
    let secs = now.as_second() - then.as_second();
    if secs < -1 {
        return "<unknown>".into();
    }
    let secs = secs.max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 8 * 3600 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s if s < 8 * 86400 => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn ts(t: &Time) -> String {
    t.0.to_string()
}

fn opt_ts(t: Option<&Time>) -> String {
    t.map(ts).unwrap_or_else(|| "-".into())
}

/// A period: seconds for a scheduled one, microseconds for a manual one.
fn period(t: &MicroTime) -> String {
    crate::naming::period_rfc3339(t.0)
}

fn outcome(o: Outcome) -> String {
    format!("{o:?}")
}

fn dash(s: Option<&str>) -> String {
    match s {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => "-".into(),
    }
}

fn count(h: &HistoryEntry) -> String {
    h.count.to_string()
}

fn token(h: &HistoryEntry) -> String {
    h.token.map(|t| t.to_string()).unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::fixtures::{entry, now, prepared, sj, t};

    #[test]
    fn table_aligns_columns() {
        let out = table(
            &["A", "LONGER"],
            &[
                vec!["xyz".into(), "1".into()],
                vec!["k".into(), "22".into()],
            ],
        );
        assert_eq!(out, "A     LONGER\nxyz   1\nk     22\n");
    }

    #[test]
    fn ages_are_short() {
        let now = now();
        let ago = |s: i64| Timestamp::from_second(now.as_second() - s).unwrap();
        assert_eq!(age(ago(5), now), "5s");
        assert_eq!(age(ago(200), now), "3m20s");
        assert_eq!(age(ago(3600), now), "60m");
        assert_eq!(age(ago(5 * 3600 + 120), now), "5h2m");
        assert_eq!(age(ago(3 * 86400), now), "3d0h");
        assert_eq!(age(ago(-100), now), "<unknown>");
    }

    #[test]
    fn list_shows_every_column() {
        let out = render_list(&[sj()], false, now());
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        for h in [
            "NAME",
            "SCHEDULE",
            "SUSPEND",
            "ACTIVE",
            "LAST RESULT",
            "LAST SCHEDULE",
            "NEXT",
            "PREPARED",
            "TOKEN",
        ] {
            assert!(lines[0].contains(h), "{h} in {out}");
        }
        assert!(!lines[0].contains("NAMESPACE"));
        let cells: Vec<&str> = lines[1].split("   ").map(str::trim).collect();
        assert!(cells.contains(&"hello"), "{cells:?}");
        assert!(cells.contains(&"*/5 * * * *"), "{cells:?}");
        assert!(cells.contains(&"false"), "{cells:?}");
        assert!(cells.contains(&"Succeeded"), "{cells:?}");
        assert!(cells.contains(&"90s ago"), "{cells:?}");
        assert!(cells.contains(&"2026-01-01T00:10:00Z"), "{cells:?}");
        assert_eq!(cells.last(), Some(&"7"));
        let cells: Vec<&str> = cells.into_iter().filter(|c| !c.is_empty()).collect();
        assert_eq!(cells[cells.len() - 2], "-", "nothing prepared: {cells:?}");
    }

    #[test]
    fn list_shows_the_prepared_run_before_the_token() {
        let mut s = sj();
        s.status.as_mut().unwrap().prepared =
            Some(prepared("2026-01-01T00:10:00Z", "2026-01-01T00:10:00.250Z"));
        let out = render_list(&[s], false, now());
        assert_eq!(
            out,
            "NAME    SCHEDULE      SUSPEND   ACTIVE   LAST RESULT   LAST SCHEDULE   NEXT                   PREPARED                   TOKEN\n\
             hello   */5 * * * *   false     1        Succeeded     90s ago         2026-01-01T00:10:00Z   2026-01-01T00:10:00.250Z   7\n"
        );
    }

    #[test]
    fn list_all_namespaces_and_empty() {
        let out = render_list(&[sj()], true, now());
        assert!(out.starts_with("NAMESPACE"), "{out}");
        assert!(out.lines().nth(1).unwrap().starts_with("team-a"), "{out}");
        assert_eq!(render_list(&[], false, now()), "No SingletonJobs found.\n");
        // A SingletonJob the controller has not seen yet has no status.
        let mut fresh = sj();
        fresh.status = None;
        let out = render_list(&[fresh], false, now());
        assert!(out.lines().nth(1).unwrap().ends_with("   0"), "{out}");
    }

    #[test]
    fn status_summarises_spec_and_status() {
        let out = render_status(&sj(), now());
        for want in [
            "Schedule:",
            "*/5 * * * *",
            "Europe/Berlin",
            "gap=AfterGap fold=First",
            "Catch Up:",
            "Latest",
            "Forbid",
            "Backstop:",
            "off",
            "Fencing Token:",
            "Ready",
            "Scheduled",
            "all good",
            "hello-1767225900",
            "2026-01-01T00:20:00Z",
            "History (last 10 of 12, newest first):",
        ] {
            assert!(out.contains(want), "{want:?} in\n{out}");
        }
        // Only the ten newest history entries: tokens 20..=11.
        assert!(out.contains("2026-01-01T00:55:00Z"), "{out}");
        assert!(out.contains("2026-01-01T00:10:00Z"), "{out}");
        assert!(!out.contains("2026-01-01T00:00:00Z   1"), "{out}");
        let history = out.split("History").nth(1).unwrap();
        assert_eq!(history.lines().count(), 12, "{history}");
        assert!(history.contains(" 11"), "{history}");
        assert!(!history.contains(" 10\n"), "{history}");
    }

    #[test]
    fn status_shows_backstop_and_empty_sections() {
        let mut s = sj();
        s.spec.backstop =
            serde_json::from_value(serde_json::json!({"postgres": {"secretRef": {"name": "db"}}}))
                .unwrap();
        s.status = None;
        let out = render_status(&s, now());
        assert!(out.contains("on (postgres, secret db)"), "{out}");
        assert!(out.contains("Conditions:\n  <none>"), "{out}");
        assert!(out.contains("Active Runs:\n  <none>"), "{out}");
        assert!(
            out.contains("History (last 0 of 0, newest first):\n  <none>"),
            "{out}"
        );
    }

    /// The `status` of [`sj`] (Europe/Berlin; now is 01:06:30 there) with `run` prepared.
    fn status_with(run: Option<RunRef>) -> String {
        let mut s = sj();
        s.status.as_mut().unwrap().prepared = run;
        render_status(&s, now())
    }

    /// The Prepared Run section of a `status` output, title included.
    fn prepared_part(out: &str) -> &str {
        let from = out.find("Prepared Run:").expect(out);
        let to = out.find("Next Schedule Times:").expect(out);
        &out[from..to]
    }

    #[test]
    fn status_shows_no_prepared_run_as_none_after_the_active_runs() {
        let out = status_with(None);
        assert!(
            out.contains(
                "Active Runs:\n  JOB                PERIOD                 TOKEN\n  \
                 hello-1767225900   2026-01-01T00:05:00Z   7\n\
                 Prepared Run:\n  <none>\nNext Schedule Times:\n"
            ),
            "{out}"
        );
        // A SingletonJob the controller has not seen yet has none either.
        let mut fresh = sj();
        fresh.status = None;
        assert!(
            render_status(&fresh, now()).contains("Prepared Run:\n  <none>\n"),
            "no status"
        );
    }

    #[test]
    fn status_shows_a_run_prepared_for_later_today_in_the_time_zone() {
        // 00:10:00Z is 01:10:00 in Berlin, today there (01:06:30).
        let out = status_with(Some(prepared(
            "2026-01-01T00:10:00Z",
            "2026-01-01T00:10:00Z",
        )));
        assert_eq!(
            prepared_part(&out),
            "Prepared Run:\n  Prepared for 01:10:00, token 8\n  \
             Job hello-1767226200 (period 2026-01-01T00:10:00Z), resumes in 3m30s\n"
        );
    }

    #[test]
    fn status_adds_the_date_of_a_run_prepared_for_another_day_there() {
        // 23:30Z is still 2026-01-01 in UTC, but 00:30 on the 2nd in Berlin.
        let out = status_with(Some(prepared(
            "2026-01-01T23:30:00Z",
            "2026-01-01T23:30:00Z",
        )));
        assert_eq!(
            prepared_part(&out),
            "Prepared Run:\n  Prepared for 2026-01-02 00:30:00, token 8\n  \
             Job hello-1767310200 (period 2026-01-01T23:30:00Z), resumes in 23h\n"
        );
    }

    #[test]
    fn status_says_how_overdue_a_prepared_run_is() {
        // Its resume was due at 00:06:05Z, 25 s before now, and it is still prepared.
        let out = status_with(Some(prepared(
            "2026-01-01T00:06:05Z",
            "2026-01-01T00:06:05Z",
        )));
        assert_eq!(
            prepared_part(&out),
            "Prepared Run:\n  Prepared for 01:06:05, token 8\n  \
             Job hello-1767225965 (period 2026-01-01T00:06:05Z), not resumed yet, due 25s ago\n"
        );
    }

    #[test]
    fn the_prepared_instant_is_read_in_the_given_time_zone() {
        let at = |s: &str| prepared("2026-01-01T00:10:00Z", s);
        let utc = TimeZone::UTC;
        let new_york = time_zone(
            &serde_json::from_value(serde_json::json!({
                "schedule": "0 * * * *", "timeZone": "America/New_York", "jobTemplate": {}
            }))
            .unwrap(),
        )
        .expect("a zone the bundled database knows");
        let berlin = time_zone(&sj().spec).expect("Europe/Berlin");
        let first_line = |r: &RunRef, tz: Option<&TimeZone>| {
            prepared_run_section(Some(r), tz, now())
                .lines()
                .nth(1)
                .unwrap()
                .to_string()
        };
        // now() is 2026-01-01 00:06:30 UTC, 01:06:30 in Berlin, 2025-12-31 19:06:30 in New York.
        let cases = [
            (&utc, "2026-01-01T00:10:00Z", "00:10:00"),
            (&berlin, "2026-01-01T00:10:00Z", "01:10:00"),
            (&new_york, "2026-01-01T00:10:00Z", "19:10:00"),
            // Today in UTC, tomorrow in New York.
            (&utc, "2026-01-01T05:30:00Z", "05:30:00"),
            (&new_york, "2026-01-01T05:30:00Z", "2026-01-01 00:30:00"),
            // Today in UTC, tomorrow in New York and in Berlin.
            (&utc, "2026-01-01T23:30:00Z", "23:30:00"),
            (&new_york, "2026-01-01T23:30:00Z", "2026-01-01 18:30:00"),
            (&berlin, "2026-01-01T23:30:00Z", "2026-01-02 00:30:00"),
            // A jittered resume shows its milliseconds.
            (&berlin, "2026-01-01T00:10:00.250Z", "01:10:00.250"),
        ];
        for (tz, resume, want) in cases {
            assert_eq!(
                first_line(&at(resume), Some(tz)),
                format!("  Prepared for {want}, token 8"),
                "{resume} in {tz:?}"
            );
        }
        // A zone the database does not know: the instant in UTC, as RFC 3339.
        assert_eq!(
            first_line(&at("2026-01-01T00:10:00.250Z"), None),
            "  Prepared for 2026-01-01T00:10:00.250Z, token 8"
        );
        let mut unknown = sj();
        unknown.spec.time_zone = Some("Mars/Olympus_Mons".into());
        assert_eq!(time_zone(&unknown.spec), None);
        unknown.spec.time_zone = None;
        assert_eq!(time_zone(&unknown.spec), Some(TimeZone::UTC));
    }

    #[test]
    fn a_prepared_run_without_resume_at_is_shown_at_its_period() {
        // resumeAt is optional in the schema: without it, the period stands in.
        let mut r = prepared("2026-01-01T00:10:00Z", "2026-01-01T00:10:00Z");
        r.resume_at = None;
        let out = status_with(Some(r));
        assert!(
            prepared_part(&out).contains("Prepared for 01:10:00, token 8\n"),
            "{out}"
        );
    }

    #[test]
    fn status_shows_a_suspension_and_the_bounds() {
        let mut s = sj();
        let out = render_status(&s, now());
        assert!(out.contains("Bounds:") && out.contains(" none\n"), "{out}");
        s.spec.suspend = Some(true);
        s.spec.suspension = Some(crate::api::Suspension {
            until: Some(Time("2027-01-03T00:00:00Z".parse().unwrap())),
            reason: Some("finance freeze".into()),
            by: Some("alice".into()),
            since: None,
        });
        s.spec.start_at = Some(Time("2027-01-01T00:00:00Z".parse().unwrap()));
        s.spec.max_runs = Some(12);
        s.status.get_or_insert_default().run_count = 3;
        let out = render_status(&s, now());
        for want in [
            "true (until 2027-01-03T00:00:00Z, by alice: finance freeze)",
            "from 2027-01-01T00:00:00Z, 3 of maxRuns 12 run",
        ] {
            assert!(out.contains(want), "{want:?} in\n{out}");
        }
    }

    #[test]
    fn history_shows_every_entry_and_folds() {
        let mut h = vec![
            entry("2026-01-01T00:05:00Z", Outcome::Succeeded, Some(2), None),
            entry(
                "2026-01-01T00:00:00Z",
                Outcome::Skipped,
                None,
                Some("Suspended"),
            ),
        ];
        h[1].last_period = Some(t("2026-01-01T00:04:00Z"));
        h[1].count = 5;
        // A rerun says who asked for it.
        h[0].reason = Some("Rerun".into());
        h[0].requested_by = Some("alice".into());
        let out = render_history(&h);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].starts_with("PERIOD   "), "{out}");
        assert!(lines[0].ends_with("FINISH"), "{out}");
        assert!(lines[0].contains("   BY   "), "{out}");
        let rerun: Vec<&str> = lines[1].split("   ").map(str::trim).collect();
        assert!(
            rerun.contains(&"Rerun") && rerun.contains(&"alice"),
            "{rerun:?}"
        );
        let skipped: Vec<&str> = lines[2].split("   ").map(str::trim).collect();
        assert!(skipped.contains(&"Skipped"), "{skipped:?}");
        assert!(skipped.contains(&"Suspended"), "{skipped:?}");
        assert!(skipped.contains(&"5"), "{skipped:?}");
        assert!(skipped.contains(&"2026-01-01T00:04:00Z"), "{skipped:?}");
        assert!(lines[1].contains("   2   "), "{out}");
        assert_eq!(render_history(&[]), "No history yet.\n");
        // Multi-cluster: a period another cluster ran names that cluster.
        let mut elsewhere = entry(
            "2026-01-01T00:10:00Z",
            Outcome::Deduplicated,
            None,
            Some("ClaimedElsewhere"),
        );
        elsewhere.cluster = Some("west".into());
        assert!(
            render_history(&[elsewhere]).contains("ClaimedElsewhere (west)"),
            "the other cluster's identity is shown"
        );
    }

    #[test]
    fn structured_outputs_parse() {
        let s = sj();
        let json = format_history(&s, Output::Json).unwrap();
        let v: Vec<HistoryEntry> = serde_json::from_str(&json).unwrap();
        assert_eq!(v.len(), 12);
        let yaml = format_status(&s, Output::Yaml, now()).unwrap();
        let back: SingletonJob = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(back, s);
        let list = format_list(std::slice::from_ref(&s), false, Output::Json, now()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&list).unwrap();
        assert_eq!(v["kind"], "List");
        assert_eq!(v["items"][0]["metadata"]["name"], "hello");
        assert!(v["items"][0]["status"].get("prepared").is_none(), "{list}");
        assert_eq!("yaml".parse::<Output>(), Ok(Output::Yaml));
        assert!("xml".parse::<Output>().is_err());
    }

    #[test]
    fn structured_outputs_carry_the_prepared_run() {
        let mut s = sj();
        s.status.as_mut().unwrap().prepared =
            Some(prepared("2026-01-01T00:10:00Z", "2026-01-01T00:10:00.250Z"));
        let list = format_list(std::slice::from_ref(&s), false, Output::Json, now()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&list).unwrap();
        let p = &v["items"][0]["status"]["prepared"];
        assert_eq!(p["jobName"], "hello-1767226200", "{list}");
        assert_eq!(p["token"], 8, "{list}");
        assert_eq!(p["basis"], "fp:1a2b3c/spec:4d5e6f", "{list}");
        assert!(
            p["resumeAt"]
                .as_str()
                .is_some_and(|r| r.starts_with("2026-01-01T00:10:00.25")),
            "{list}"
        );
        for output in [Output::Json, Output::Yaml] {
            let text = format_status(&s, output, now()).unwrap();
            assert!(
                text.contains("prepared") && text.contains("resumeAt"),
                "{text}"
            );
            let back: SingletonJob = match output {
                Output::Json => serde_json::from_str(&text).unwrap(),
                _ => serde_yaml::from_str(&text).unwrap(),
            };
            assert_eq!(back, s);
        }
    }
}
