//! The `SingletonJob` API (`singleton.dev/v1alpha1`).
//!
//! Doc comments on these types become the CRD's OpenAPI descriptions, so they are written for the
//! user who runs `kubectl explain singletonjob.spec`.

use k8s_openapi::api::batch::v1::JobTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod notify;
pub use notify::*;

pub use crate::schedule::{
    Bounds, DateRange, DayRules, DstPolicy, ExcludedAction, FoldPolicy, GapPolicy,
};

/// API group of every resource this project defines.
pub const GROUP: &str = "singleton.dev";

/// The CRD as it is installed (`crds/singletonjob.yaml`, written by `crdgen`): the schema
/// generated from these types, with every description reflowed ([`reflow`]) so that
/// `kubectl explain` wraps whole sentences rather than the doc comments' source lines.
pub fn crd() -> Crd {
    reflowed::<SingletonJob>()
}

/// The SingletonCalendar CRD (`crds/singletoncalendar.yaml`), made as [`crd`] is.
pub fn calendar_crd() -> Crd {
    reflowed::<SingletonCalendar>()
}

/// A CustomResourceDefinition.
pub type Crd =
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

fn reflowed<K: kube::CustomResourceExt>() -> Crd {
    let crd = K::crd();
    let mut value = serde_json::to_value(&crd).unwrap_or_default();
    reflow_descriptions(&mut value);
    serde_json::from_value(value).unwrap_or(crd)
}

/// The places in `text` where a line ends inside a paragraph (the next line is neither blank, a
/// list item nor code): for `kubectl explain`, which wraps text itself, a sentence cut in two.
pub fn broken_sentences(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .filter(|w| {
            let next = w[1].trim_start();
            let kept = next.is_empty()
                || is_item(next)
                || next.starts_with("```")
                || w[1].starts_with("    ");
            !w[0].trim().is_empty() && !kept && !w[0].trim_start().starts_with("```")
        })
        .map(|w| format!("{:?} / {:?}", w[0], w[1]))
        .collect()
}

/// Whether a (trimmed) line is a list item: `- `, `* ` or `1. `.
fn is_item(s: &str) -> bool {
    s.starts_with("- ")
        || s.starts_with("* ")
        || s.split_once(". ")
            .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// Every `description` in a JSON schema (or a whole CRD as JSON), for checks like
/// [`broken_sentences`].
pub fn descriptions(node: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![node];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Object(map) => {
                for (k, child) in map {
                    match (k.as_str(), child) {
                        ("description", serde_json::Value::String(s)) => out.push(s.clone()),
                        _ => stack.push(child),
                    }
                }
            }
            serde_json::Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    out
}

fn reflow_descriptions(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                match (k.as_str(), child) {
                    ("description", serde_json::Value::String(text)) => *text = reflow(text),
                    (_, child) => reflow_descriptions(child),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(reflow_descriptions),
        _ => {}
    }
}

/// Joins the lines of each paragraph of a doc comment into one, as Kubernetes' own types and
/// controller-gen's CRDs do, keeping paragraph breaks, list items (`- `, `* `, `1. `) and code
/// (fenced, or indented by four spaces) on lines of their own.
pub fn reflow(text: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut fenced = false;
    // Whether the last line taken may have the next one joined to it.
    let mut open = false;
    for line in text.lines() {
        let t = line.trim_end();
        let fence = t.trim_start().starts_with("```");
        let kept = fenced || fence || t.starts_with("    ") || t.is_empty();
        let item = is_item(t.trim_start());
        if fence {
            fenced = !fenced;
        }
        match out.last_mut() {
            Some(last) if open && !kept && !item => {
                last.push(' ');
                last.push_str(t.trim_start());
            }
            _ => out.push(t.to_string()),
        }
        open = !kept;
    }
    out.join("\n")
}

/// The largest `startingDeadlineSeconds` (ten years), in the CRD's schema and in decisions.
pub const MAX_STARTING_DEADLINE_SECONDS: i64 = 315_360_000;

// clippy reads the repeated `type_` keys of separate printcolumn(...) groups as duplicates.
#[allow(clippy::duplicated_attributes)]
/// Runs a Job from `jobTemplate` at most once per scheduled period, and hands every run a fencing
/// token that only increases, so that a stale run's writes can be refused by the target database.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "singleton.dev",
    version = "v1alpha1",
    kind = "SingletonJob",
    plural = "singletonjobs",
    shortname = "sj",
    category = "all",
    namespaced,
    status = "SingletonJobStatus",
    derive = "PartialEq",
    doc = "A scheduled Job that runs at most once per period, each run with a fencing token.",
    printcolumn(name = "Schedule", type_ = "string", json_path = ".spec.schedule"),
    printcolumn(name = "Suspend", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(name = "Active", type_ = "integer", json_path = ".status.activeCount"),
    printcolumn(
        name = "Last Result",
        type_ = "string",
        json_path = ".status.lastResult"
    ),
    printcolumn(
        name = "Last Schedule",
        type_ = "date",
        json_path = ".status.lastScheduleTime"
    ),
    printcolumn(
        name = "Next",
        type_ = "string",
        json_path = ".status.nextScheduleTime"
    ),
    printcolumn(
        name = "Prepared",
        type_ = "string",
        json_path = ".status.prepared.resumeAt"
    ),
    printcolumn(name = "Token", type_ = "integer", json_path = ".status.fencingToken"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    // Event names are the object's name plus 17 characters and may not exceed 253.
    validation = Rule::new("size(self.metadata.name) <= 230")
        .message("metadata.name must be at most 230 characters (Events about it add a suffix)")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.schedule) != has(self.schedules)")
        .message("set exactly one of schedule and schedules")
)]
#[x_kube(
    validation = Rule::new(concat!(
        "(has(self.lock) && has(self.lock.purpose) && self.lock.purpose == 'Efficiency') || !has(self.jobTemplate.spec) || (",
        "(!has(self.jobTemplate.spec.parallelism) || self.jobTemplate.spec.parallelism <= 1) && ",
        "(!has(self.jobTemplate.spec.completions) || self.jobTemplate.spec.completions <= 1) && ",
        "(!has(self.jobTemplate.spec.podReplacementPolicy) || self.jobTemplate.spec.podReplacementPolicy == 'Failed'))"
    ))
    .message("under lock.purpose: Correctness a run is one process at a time: jobTemplate.spec.parallelism and completions must be 1 (or unset) and podReplacementPolicy Failed (or unset); use lock.purpose: Efficiency for runs of several pods")
)]
#[x_kube(
    validation = Rule::new("!has(self.startAt) || !has(self.endAt) || self.startAt <= self.endAt")
        .message("startAt must not be after endAt: no period could run")
)]
#[x_kube(
    validation = Rule::new("!has(self.suspension) || (has(self.suspend) && self.suspend)")
        .message("spec.suspension describes a suspension: set suspend: true with it, or remove it (kubectl singleton resume does both)")
)]
pub struct SingletonJobSpec {
    /// When runs are due: standard 5-field cron (`minute hour day-of-month month day-of-week`),
    /// read as Kubernetes CronJob reads it, 6 fields with leading seconds, a macro (`@hourly`,
    /// `@daily`, `@weekly`, `@monthly`, `@yearly`), or `@every <interval> [+<offset>]` (`@every
    /// 15m`, `@every 6h +30m`: from the Unix epoch plus the offset, so every replica and restart
    /// computes the same instants; the time zone does not move them). When both day-of-month and
    /// day-of-week are restricted, a day matching either runs (as in Vixie cron and CronJob).
    /// Check a schedule with `kubectl singleton schedule`. Set this or `schedules`, not both.
    #[x_kube(
        validation = Rule::new("self.startsWith('@') || size(self.trim().split(' ').filter(f, f != '')) in [5, 6]")
            .message("schedule must have 5 fields (minute hour day-of-month month day-of-week), 6 with leading seconds, or be a macro such as @daily")
    )]
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 256))]
    pub schedule: String,

    /// Several schedules, each written as `schedule` is, read in the same time zone: the periods
    /// are their union, and an instant two of them produce is one period. Set this or `schedule`,
    /// not both.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 20), inner(length(min = 1, max = 256)))]
    #[x_kube(
        validation = Rule::new("self.all(s, s.startsWith('@') || size(s.trim().split(' ').filter(f, f != '')) in [5, 6])")
            .message("each of schedules must have 5 fields (minute hour day-of-month month day-of-week), 6 with leading seconds, or be a macro such as @daily")
    )]
    pub schedules: Vec<String>,

    /// Days on which periods do not run: dates, ranges, day rules and SingletonCalendars, and
    /// whether such a period is skipped or moved to the next allowed day. Days are read in
    /// `timeZone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusions: Option<ExclusionsSpec>,

    /// Spreads each run's start over this many seconds after its instant, by an offset derived
    /// from the SingletonJob and the period (the same on every replica and after restarts), so
    /// that many jobs scheduled at the same instant do not start together. The period keeps its
    /// instant as its identity; deadlines count from the end of the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86_400))]
    pub jitter_seconds: Option<i32>,

    /// Prepare each run this many seconds before its instant: its period is claimed, its Job
    /// created suspended and confirmed ahead of time, and at the instant one request starts it
    /// (never before the instant). Anything that changes the period's decision meanwhile (an
    /// edit, `suspend`, a trigger) withdraws the prepared run: its Job never runs and the period
    /// is decided as it would have been without preparation. 0: never prepared. Unset: the
    /// controller's `--prepare-lead-seconds`. A lead longer than the time since the previous
    /// instant is shortened to it (the previous period is decided first), and the
    /// `Preparation` condition says so. Not used with a backstop shared by several clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub prepare_lead_seconds: Option<i64>,

    /// IANA time zone the schedule is read in, such as `Europe/Berlin`. Default: UTC (never the
    /// controller's local zone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(
        validation = Rule::new("self.matches('^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$')")
            .message("timeZone must be an IANA name such as Europe/Berlin or UTC")
    )]
    pub time_zone: Option<String>,

    /// What to do with wall times that daylight-saving changes skip or repeat. The default runs a
    /// skipped wall time once at the first instant after the gap, and a repeated one once, at its
    /// first occurrence: never twice, never lost.
    #[serde(default, skip_serializing_if = "is_default")]
    pub dst_policy: DstPolicy,

    /// A period that cannot start within this many seconds of its scheduled instant is recorded as
    /// Missed (reason DeadlineExceeded) instead of starting late. Unset: no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_STARTING_DEADLINE_SECONDS))]
    pub starting_deadline_seconds: Option<i64>,

    /// What happens to periods that fell due while they could not start (the controller was down,
    /// the SingletonJob was suspended, or a Forbid run was still active). `Latest` (default, like
    /// CronJob) starts only the newest and records the older ones as Missed; `All` starts every one,
    /// oldest first, each exactly once; `None` starts none of them late.
    #[serde(default)]
    pub catch_up: CatchUp,

    /// With `catchUp: All`, at most this many late periods are started: the newest ones. Older
    /// pending periods are recorded as Missed (reason CatchUpLimit), so that a SingletonJob
    /// suspended or without a controller for a long time does not start a Job for every period
    /// it missed (an every-second schedule suspended for a day would otherwise owe 86,400
    /// runs). Default 100, at most 10,000 (the backfill limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000))]
    pub catch_up_limit: Option<i32>,

    /// Whether a new run may start while an earlier one is still active. `Forbid` (default): it
    /// waits, or is Skipped when `catchUp` is `None`; `Replace`: the active run is fenced and
    /// deleted first; `Allow`: runs overlap.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,

    /// With `concurrencyPolicy: Allow`, at most this many runs are active at once. A period due
    /// while as many are active waits, as under `Forbid`, or is Skipped (reason MaxActive) when
    /// `catchUp` is `None`; manual runs (trigger, backfill, rerun) wait too. Default 10, at most
    /// 1000. `Forbid` and `Replace` keep one active run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_active: Option<i32>,

    /// Stops new runs from starting; active runs continue. Periods falling due while suspended are
    /// recorded as Skipped (reason Suspended) unless `catchUp` starts them on resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub suspend: Option<bool>,

    /// Why the SingletonJob is suspended, by whom, and until when (`kubectl singleton suspend
    /// --until TIME --reason TEXT` writes it; `kubectl singleton resume` removes it). Only with
    /// `suspend: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspension: Option<Suspension>,

    /// The first instant a period may have (RFC 3339, such as `2027-01-01T00:00:00Z`): the
    /// schedule's instants before it are not this SingletonJob's periods (not run, not recorded,
    /// not shown as next). Unset: from the SingletonJob's creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<Time>,

    /// The last instant a period may have (included): no period after it runs, and once it has
    /// passed the `Ended` condition says so (reason EndAtPassed). Moving it later resumes the
    /// SingletonJob as `suspend: false` does: `catchUp` decides about the periods that fell due
    /// after the old `endAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<Time>,

    /// At most this many of the schedule's periods run: those the schedule or a backfill claimed,
    /// counted in `status.runCount` (a manual trigger and a rerun of a decided period are not
    /// counted, and not stopped). Once reached, no period is due (the `Ended` condition, reason
    /// MaxRunsReached) and a backfill stops; raising it resumes as `endAt` moved later does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_runs: Option<i64>,

    /// A period's run must succeed within this many seconds of its instant. A run still active
    /// then is recorded as late (`late` in `status.active` and in its history entry) with a
    /// `RunLate` Event and the `singleton_runs_late_total` metric; what happens to it is
    /// `completionDeadlinePolicy`. Unset: no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 315_360_000))]
    pub completion_deadline_seconds: Option<i64>,

    /// What happens to a run at its completion deadline: `Continue` (default) lets it finish,
    /// `Stop` ends it there (its Job's `activeDeadlineSeconds` is set so that Kubernetes stops it
    /// at the deadline, and it is recorded as Failed).
    #[serde(default, skip_serializing_if = "is_default")]
    pub completion_deadline_policy: CompletionDeadlinePolicy,

    /// Suspends the SingletonJob (sets `suspend: true`, with a `SuspendedAfterFailures` Event and
    /// the `Suspended` condition's reason) after this many runs in a row have failed. Resuming
    /// starts the count again. Unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub suspend_after_consecutive_failures: Option<i32>,

    /// How many finished successful Jobs to keep. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub successful_jobs_history_limit: Option<i32>,

    /// How many finished failed Jobs to keep. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub failed_jobs_history_limit: Option<i32>,

    /// How runs are protected beyond the Kubernetes API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<LockSpec>,

    /// A database that records each period's claim and fences stale runs (the last line of
    /// defence, beyond the Kubernetes API). See docs/fencing.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backstop: Option<BackstopSpec>,

    /// The Job created for each period, as in CronJob. Every container receives the environment
    /// variables SINGLETON_JOB, SINGLETON_PERIOD, SINGLETON_FENCING_TOKEN,
    /// SINGLETON_IDEMPOTENCY_KEY, SINGLETON_ATTEMPT (the pod's uid), and the period's window:
    /// SINGLETON_PREVIOUS_PERIOD and SINGLETON_NEXT_PERIOD (the schedule's periods around it that
    /// run; empty when none), SINGLETON_TIME_ZONE, SINGLETON_BUSINESS_DATE (its local date) and
    /// SINGLETON_PERIOD_KEY (its local time with offset and zone). `ttlSecondsAfterFinished` is
    /// not honoured: finished Jobs are pruned by the history limits, so that a Job is never gone
    /// before its outcome is recorded. A run is one process at a time: the Job gets
    /// `podReplacementPolicy: Failed` (no replacement pod while the previous one still
    /// terminates), and under `lock.purpose: Correctness` `parallelism` and `completions` above 1
    /// are refused. With `spec.suspend: true` (a queue such as Kueue admits the Job) the queue
    /// label `kueue.x-k8s.io/queue-name` is added only once the run's claim is confirmed.
    #[schemars(schema_with = "job_template_schema")]
    pub job_template: JobTemplate,

    /// Receivers told what happened to each period (CloudEvents over HTTP, Slack, Healthchecks),
    /// at least once, never holding up a run. Unset: the controller's defaults (the chart's
    /// `notify.defaults`, if any); `[]`: none. See docs/notifications.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    #[x_kube(
        validation = Rule::new("self.all(t, self.exists_one(u, u.name == t.name))")
            .message("notify target names must be unique")
    )]
    pub notify: Option<Vec<NotifyTarget>>,
}

/// `catchUpLimit` when unset.
pub const DEFAULT_CATCH_UP_LIMIT: u32 = 100;
/// `maxActive` when unset.
pub const DEFAULT_MAX_ACTIVE: u32 = 10;

impl SingletonJobSpec {
    /// `catchUpLimit`, or its default (the schema keeps it from 1 to 10,000).
    pub fn catch_up_limit(&self) -> u32 {
        self.catch_up_limit
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n >= 1)
            .unwrap_or(DEFAULT_CATCH_UP_LIMIT)
    }

    /// How many runs may be active at once: `maxActive` (default 10) under `Allow`, else 1.
    pub fn max_active(&self) -> usize {
        if self.concurrency_policy != ConcurrencyPolicy::Allow {
            return 1;
        }
        self.max_active
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n >= 1)
            .unwrap_or(DEFAULT_MAX_ACTIVE) as usize
    }

    /// `jitterSeconds`, 0 when unset (the schema keeps it from 0 to 86400).
    pub fn jitter_window(&self) -> u32 {
        self.jitter_seconds
            .and_then(|j| u32::try_from(j).ok())
            .unwrap_or(0)
    }

    /// `startAt` and `endAt`.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            start: self.start_at.as_ref().map(|t| t.0),
            end: self.end_at.as_ref().map(|t| t.0),
        }
    }

    /// `maxRuns`, if set; one below 1 (past the schema's bounds) allows none.
    pub fn max_runs(&self) -> Option<u64> {
        self.max_runs.map(|n| u64::try_from(n).unwrap_or(0))
    }

    /// `suspension.until` while `suspend` is true: when the suspension ends by itself.
    pub fn suspended_until(&self) -> Option<jiff::Timestamp> {
        self.suspend
            .unwrap_or(false)
            .then(|| self.suspension.as_ref()?.until.as_ref().map(|t| t.0))
            .flatten()
    }
}

/// Annotation through which `kubectl singleton trigger` asks for a run now:
/// `{"id": "...", "by": "..."}`.
pub const ANNOTATION_TRIGGER: &str = "singleton.dev/trigger";
/// Annotation through which `kubectl singleton backfill` asks for past periods:
/// `{"id": "...", "by": "...", "from": "<RFC 3339>", "to": "<RFC 3339>"}`.
pub const ANNOTATION_BACKFILL: &str = "singleton.dev/backfill";
/// Annotation through which `kubectl singleton break-lock` asks to fence out every issued token:
/// `{"id": "...", "by": "...", "reason": "..."}`.
pub const ANNOTATION_BREAK_LOCK: &str = "singleton.dev/break-lock";
/// Annotation through which `kubectl singleton rerun` asks to run a decided period again, with a
/// new token that fences the earlier run out:
/// `{"id": "...", "by": "...", "period": "<RFC 3339>", "replace": false}`.
pub const ANNOTATION_RERUN: &str = "singleton.dev/rerun";
/// Annotation through which `kubectl singleton rerun --from --to` asks to re-run every period of
/// a range whose records match `only`, each like a rerun:
/// `{"id": "...", "by": "...", "from": "<RFC 3339>", "to": "<RFC 3339>", "only": "Failed",
/// "order": "Oldest", "parallel": 1}`.
pub const ANNOTATION_REPAIR: &str = "singleton.dev/repair";
/// Annotation through which `kubectl singleton rerun --from --to --dry-run` asks which periods a
/// repair would re-run now, without running any (same fields as [`ANNOTATION_REPAIR`]).
pub const ANNOTATION_REPAIR_DRY_RUN: &str = "singleton.dev/repair-dry-run";

/// A batch/v1 JobTemplateSpec, kept as the user wrote it. The API server stores it without a
/// schema, so a wrongly typed field inside it must not make the whole SingletonJob undecodable:
/// that would fail every list of SingletonJobs and stall the controller for all of them. It is
/// decoded when a Job is built, and a bad one is reported as `JobTemplateValid=False`.
///
/// Held as compact JSON text rather than a `serde_json::Value`, which allocates a node per JSON
/// object and was the largest part of a cached SingletonJob (docs/performance.md). The text is
/// shared, so cloning a SingletonJob does not copy it. A template over
/// [`MAX_JOB_TEMPLATE_BYTES`] is not kept at all, only its size: every SingletonJob is cached,
/// and a few hundred templates of a megabyte each would exhaust the controller's memory.
#[derive(Clone, Debug, PartialEq)]
pub struct JobTemplate(Template);

#[derive(Clone, Debug, PartialEq)]
enum Template {
    Text(std::sync::Arc<str>),
    /// Over the limit: its size in bytes (compact JSON).
    Oversize(usize),
}

/// The largest `jobTemplate` the controller runs, as compact JSON: 64 KiB. A template with a
/// dozen containers and their environment is a few KiB; at 64 KiB, 2,000 SingletonJobs cache at
/// most 128 MiB of templates (half the default memory limit). The CRD cannot say this (CEL
/// cannot measure an object kept with `x-kubernetes-preserve-unknown-fields`), so the controller
/// refuses a larger one with `JobTemplateValid=False` and keeps only its size.
pub const MAX_JOB_TEMPLATE_BYTES: usize = 64 * 1024;

impl JobTemplate {
    /// The typed template, or why it is not one.
    pub fn decode(&self) -> Result<JobTemplateSpec, String> {
        match &self.0 {
            Template::Text(text) => serde_json::from_str(text)
                .map_err(|e| format!("not a valid batch/v1 JobTemplateSpec: {e}")),
            Template::Oversize(bytes) => Err(oversize(*bytes)),
        }
    }

    /// The bytes this template holds in memory (its text; a few for one over the limit).
    pub fn held_bytes(&self) -> usize {
        match &self.0 {
            Template::Text(text) => text.len(),
            Template::Oversize(_) => 0,
        }
    }

    fn value(&self) -> Result<serde_json::Value, String> {
        match &self.0 {
            Template::Text(text) => serde_json::from_str(text).map_err(|e| e.to_string()),
            // Never written back as something it is not.
            Template::Oversize(bytes) => Err(oversize(*bytes)),
        }
    }
}

fn oversize(bytes: usize) -> String {
    format!(
        "jobTemplate is {bytes} bytes as compact JSON, more than the limit of {MAX_JOB_TEMPLATE_BYTES} bytes (64 KiB); move large data into a ConfigMap or Secret the pod mounts"
    )
}

impl Default for JobTemplate {
    /// No template: JSON `null`, as an absent field decodes.
    fn default() -> Self {
        JobTemplate(Template::Text("null".into()))
    }
}

impl From<serde_json::Value> for JobTemplate {
    fn from(v: serde_json::Value) -> Self {
        // A Value always prints (map keys are strings); the keys come out sorted, so equal
        // templates have equal text.
        let text = v.to_string();
        if text.len() > MAX_JOB_TEMPLATE_BYTES {
            return JobTemplate(Template::Oversize(text.len()));
        }
        JobTemplate(Template::Text(text.into()))
    }
}

impl Serialize for JobTemplate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Through a Value so that every serializer (JSON to the API server, YAML in the plugin)
        // gets the structure rather than a string.
        self.value()
            .map_err(serde::ser::Error::custom)?
            .serialize(s)
    }
}

impl<'de> Deserialize<'de> for JobTemplate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde_json::Value::deserialize(d).map(JobTemplate::from)
    }
}

/// Tokens are u64 in Rust; OpenAPI has no unsigned format Kubernetes knows, so publish int64 >= 0.
fn token_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "integer", "format": "int64", "minimum": 0})
}

/// A repair's parallelism: u32 in Rust, published as the int32 Kubernetes knows.
fn parallel_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "integer", "format": "int32", "minimum": 1, "nullable": true})
}

/// A count: u64 in Rust, published as int64 >= 0.
fn counter_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    token_schema(g)
}

fn optional_token_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "integer", "format": "int64", "minimum": 0, "nullable": true})
}

fn count_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "integer", "format": "int64", "minimum": 1})
}

fn is_default<T: Default + PartialEq>(t: &T) -> bool {
    *t == T::default()
}

/// The pod template is validated by the API server when each Job is created (and by a dry run at
/// reconcile time); embedding the full PodSpec schema would make the CRD several hundred KiB.
/// The three fields the one-process rule reads are declared (typed), so that the rule on the
/// spec can refuse them at apply time; everything else is kept as written.
fn job_template_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "A batch/v1 JobTemplateSpec (metadata and spec of the Job to create per period).",
        "x-kubernetes-preserve-unknown-fields": true,
        "properties": {
            "spec": {
                "type": "object",
                "description": "A batch/v1 JobSpec. Under lock.purpose: Correctness a run is one process at a time: parallelism and completions at most 1, podReplacementPolicy Failed.",
                "x-kubernetes-preserve-unknown-fields": true,
                "properties": {
                    "parallelism": {"type": "integer", "format": "int32", "description": "Pods running at once: 1 (or unset) under lock.purpose: Correctness."},
                    "completions": {"type": "integer", "format": "int32", "description": "Pods that must succeed: 1 (or unset) under lock.purpose: Correctness."},
                    "podReplacementPolicy": {"type": "string", "description": "When a replacement pod starts: Failed (the controller's default: only once the previous pod is terminal); TerminatingOrFailed is refused under lock.purpose: Correctness."},
                },
            },
        },
    })
}

/// Excluded days of a SingletonJob.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExclusionsSpec {
    /// Dates, ranges and day rules written here.
    #[serde(flatten)]
    pub rules: DayRules,

    /// Names of SingletonCalendars in the same namespace whose days are excluded too. A calendar
    /// that does not exist stops new runs (the `ScheduleValid` condition says which) rather than
    /// running on a day it would have excluded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10), inner(length(min = 1, max = 253)))]
    pub calendars: Vec<String>,

    /// `Skip` (default): a period on an excluded day is recorded as Skipped, reason Excluded.
    /// `NextAllowedDay`: it runs at the same wall time on the next day that is not excluded (a
    /// business-day rule: "the 1st, or the next business day"); periods moved onto the same
    /// instant are one period.
    #[serde(default)]
    pub action: ExcludedAction,
}

/// Why and until when a SingletonJob is suspended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Suspension {
    /// When the controller resumes the SingletonJob by itself: it sets `suspend: false` and
    /// removes `suspension` (Event `SuspensionEnded`). Every period whose instant falls before it is
    /// Skipped (reason Suspended, with this reason), and never started late whatever `catchUp`
    /// says: a freeze with an end is planned, and the thaw must not run what it froze (run one
    /// afterwards with `kubectl singleton backfill`). Unset: until resumed by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,

    /// Why, for people: "finance freeze until the 3rd".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reason: Option<String>,

    /// Who suspended it, as the API server named them to `kubectl singleton suspend`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub by: Option<String>,

    /// When it was suspended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

impl Suspension {
    /// "until 2027-01-03T00:00:00Z, by alice: finance freeze": the parts that were said, for
    /// the `Suspended` condition, the history of the periods it skipped and the plugin.
    pub fn note(&self) -> String {
        let mut parts = Vec::new();
        if let Some(until) = &self.until {
            parts.push(format!("until {}", until.0));
        }
        if let Some(by) = &self.by {
            parts.push(format!("by {by}"));
        }
        let head = parts.join(", ");
        match (&self.reason, head.is_empty()) {
            (Some(why), true) => why.clone(),
            (Some(why), false) => format!("{head}: {why}"),
            (None, _) => head,
        }
    }
}

/// What happens to a run at its completion deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CompletionDeadlinePolicy {
    /// The run goes on; it is recorded as late.
    #[default]
    Continue,
    /// The run is stopped at the deadline and recorded as Failed (and late).
    Stop,
}

/// Days on which SingletonJobs that name this calendar in `spec.exclusions.calendars` do not
/// run, such as a country's bank holidays. Days are read in each SingletonJob's time zone. An
/// edit applies from the moment it is seen: it never makes a past period run.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "singleton.dev",
    version = "v1alpha1",
    kind = "SingletonCalendar",
    plural = "singletoncalendars",
    shortname = "scal",
    namespaced,
    derive = "PartialEq",
    doc = "Days on which the SingletonJobs that name this calendar do not run."
)]
#[serde(rename_all = "camelCase")]
pub struct SingletonCalendarSpec {
    /// What the calendar is, for people: "Bank holidays in Germany, 2027".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub description: Option<String>,

    /// The excluded dates, ranges and day rules.
    #[serde(flatten)]
    pub rules: DayRules,
}

/// Handling of periods that could not start on time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CatchUp {
    /// Start no late period: each is recorded as Missed.
    None,
    /// Start only the newest late period within the deadline; older ones are recorded as Missed.
    #[default]
    Latest,
    /// Start every late period within the deadline, oldest first, each exactly once.
    All,
}

/// Overlap of runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConcurrencyPolicy {
    /// Never two active runs: a due period waits for the active one (or is Skipped with catchUp None).
    #[default]
    Forbid,
    /// Fence and delete the active run, then start the new one.
    Replace,
    /// Runs may overlap.
    Allow,
}

/// Protection of runs beyond the Kubernetes API.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockSpec {
    /// `Correctness` (default): a run whose claim cannot be recorded in the configured backstop
    /// does not start. `Efficiency`: the run starts anyway and status says the claim was skipped.
    #[serde(default)]
    pub purpose: LockPurpose,
}

/// Target databases that back claims and fencing. Exactly one kind is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.postgres) != has(self.mysql)").message("backstop needs exactly one database kind: postgres or mysql"))]
pub struct BackstopSpec {
    /// PostgreSQL: a claims table with UNIQUE(job, period), a fence row per job, and the
    /// `singleton_fence(job, token)` function for workloads, created by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres: Option<PostgresBackstop>,
    /// MariaDB 10.6 or later (MySQL 8.0.16 or later: see docs/fencing.md for what differs): the
    /// same tables and the same `singleton_attempt(job, token, attempt)` and
    /// `singleton_fence(job, token, attempt)` functions, raising the same SQLSTATEs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mysql: Option<MysqlBackstop>,
    /// The job's name in the backstop database (claims, fence, `SINGLETON_JOB`). Default
    /// `namespace/name`. SingletonJobs in several clusters that share one database and carry the
    /// same key are one job: each period runs in one cluster only (docs/multi-cluster.md). A key
    /// belongs to the namespace of its first claim (the same namespace in every cluster); a
    /// SingletonJob in another namespace that names it runs nothing, its periods Missed with
    /// reason JobKeyOwnedElsewhere (docs/security.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub job_key: Option<String>,
    /// Multi-cluster: another cluster's claim of a period not confirmed as started within this
    /// many seconds, by the database's clock, is taken over by this cluster, and the fence is
    /// raised so the first claimer's late start and writes are refused. Unset: never taken over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub takeover_after_seconds: Option<i64>,
    /// Multi-cluster standby: claim a period only this many seconds after its instant, by the
    /// database's clock, so the primary (unset) claims every period while it is up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub standby_delay_seconds: Option<i64>,
}

/// Where the PostgreSQL backstop is and how to reach it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgresBackstop {
    /// A Secret in this SingletonJob's namespace holding the connection, labelled
    /// `singleton.dev/backstop: "true"` (an unlabelled Secret is refused, so permission to create
    /// SingletonJobs is not permission to use any Secret). Keys: `url` (postgres://...), or
    /// `host`, `port`, `dbname`, `user`, `password`; optional `sslmode` and `sslrootcert` (the
    /// CA's PEM). `sslmode` defaults to `verify-full`: TLS, with the server's certificate and
    /// host name checked against `sslrootcert` (else the system's CA certificates). `verify-ca`
    /// skips the name; `require`, `prefer` and `disable` do not verify the server, and over them
    /// the controller refuses cleartext and MD5 password authentication (SCRAM still works).
    pub secret_ref: SecretRef,
    /// Prefix of the controller's tables and function (`<prefix>claims`, `<prefix>fences`).
    /// Default `singleton_`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = Rule::new("self.matches('^[a-z_][a-z0-9_]{0,31}$')")
            .message("tablePrefix must be a lower-case SQL identifier of at most 32 characters")
    )]
    pub table_prefix: Option<String>,
}

/// Where the MariaDB/MySQL backstop is and how to reach it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MysqlBackstop {
    /// A Secret in this SingletonJob's namespace holding the connection, labelled
    /// `singleton.dev/backstop: "true"`. Keys: `url` (mysql:// or mariadb://...), or `host`,
    /// `port` (3306), `dbname`, `user`, `password`; optional `sslmode` (`disable`, `require`,
    /// `verify-ca`, `verify-full`, the default; MySQL's `DISABLED`, `REQUIRED`, `VERIFY_CA`,
    /// `VERIFY_IDENTITY` too) and `sslrootcert` (the CA's PEM). The database must exist; the
    /// controller creates its tables and functions there.
    pub secret_ref: SecretRef,
    /// Prefix of the controller's tables and functions (`<prefix>claims`, `<prefix>fence`).
    /// Default `singleton_`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = Rule::new("self.matches('^[a-z_][a-z0-9_]{0,31}$')")
            .message("tablePrefix must be a lower-case SQL identifier of at most 32 characters")
    )]
    pub table_prefix: Option<String>,
}

/// The database kinds a backstop can be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BackstopKind {
    /// `spec.backstop.postgres`.
    #[default]
    Postgres,
    /// `spec.backstop.mysql` (MariaDB or MySQL).
    Mysql,
}

impl BackstopSpec {
    /// The configured database: its kind, Secret and table prefix (`None`: no kind set, which
    /// the CRD refuses).
    pub fn database(&self) -> Option<(BackstopKind, &SecretRef, Option<&str>)> {
        match (&self.postgres, &self.mysql) {
            (Some(pg), _) => Some((
                BackstopKind::Postgres,
                &pg.secret_ref,
                pg.table_prefix.as_deref(),
            )),
            (None, Some(my)) => Some((
                BackstopKind::Mysql,
                &my.secret_ref,
                my.table_prefix.as_deref(),
            )),
            (None, None) => None,
        }
    }
}

/// A Secret in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// The Secret's name (a DNS subdomain: lower-case letters, digits, `-` and `.`).
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ))]
    pub name: String,
}

/// Why the job is locked, after Kleppmann: for efficiency or for correctness.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum LockPurpose {
    /// A double run is a bug: never start without every configured layer of defence.
    #[default]
    Correctness,
    /// A double run only wastes work: prefer running over waiting for the backstop.
    Efficiency,
}

/// Status fields this release does not know, as read: written by a newer release of the
/// controller (one with a field this one lacks), they go back unchanged with every status write
/// of this one, so a rolling upgrade or a rollback that hands leadership to an older replica
/// never drops what a newer one recorded (issue 36; docs/design.md, "Version skew"). A status
/// write is a full replace (PUT) of the status, and serde would otherwise skip such fields on
/// read and leave them out on write. Never part of the CRD's schema: the newer release's CRD,
/// which the API server serves, describes them.
///
/// One pointer wide, and nothing allocated while empty: every cached run and history entry
/// carries one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Unknown(Option<Box<serde_json::Map<String, serde_json::Value>>>);

impl Unknown {
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The field `key`, if a newer release wrote it.
    #[cfg(test)]
    pub fn get(&self, key: &str) -> Option<&serde_json::Value> {
        self.0.as_ref()?.get(key)
    }

    /// Sets the field `key` (tests that stand for a newer release).
    #[cfg(test)]
    pub fn insert(&mut self, key: &str, value: serde_json::Value) {
        self.0
            .get_or_insert_default()
            .insert(key.to_string(), value);
    }

    #[cfg(test)]
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().flat_map(|m| m.keys())
    }
}

// As a map of its fields (flattened into the struct that holds it).
impl Serialize for Unknown {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        for (k, v) in self.0.iter().flat_map(|m| m.iter()) {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Unknown {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = serde_json::Map::deserialize(d)?;
        Ok(Unknown((!map.is_empty()).then(|| Box::new(map))))
    }
}

/// Observed state, written only by the controller.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SingletonJobStatus {
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Ready, ScheduleValid, Suspended, ClockTrusted, JobTemplateValid, BackstopReady,
    /// StatusConsistent and, with `startAt`, `endAt` or `maxRuns`, Ended: Kubernetes API conventions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// Runs that failed in a row since the last success or the last suspension by
    /// `suspendAfterConsecutiveFailures`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub consecutive_failures: i32,

    /// When `suspendAfterConsecutiveFailures` suspended the SingletonJob; cleared when it is
    /// resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_after_failures: Option<Time>,

    /// The highest fencing token issued to a run of this SingletonJob. Strictly increasing.
    #[serde(default)]
    #[schemars(schema_with = "token_schema")]
    pub fencing_token: u64,

    /// How many of the schedule's periods were claimed to run, by the schedule or a backfill
    /// (not triggers, not reruns): what `maxRuns` counts. A claimed period counts even if its Job
    /// then never ran, so that `maxRuns` is never exceeded.
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(schema_with = "token_schema")]
    pub run_count: u64,

    /// Every scheduled period at or before this instant has been decided (started or recorded
    /// with an outcome); periods after it are still to come. Moves only forward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_through: Option<Time>,

    /// Fingerprint of schedule, time zone and DST policy that `decidedThrough` refers to; a change
    /// restarts the schedule from the time of the change, so an edit never fires retroactively.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_fingerprint: Option<String>,

    /// Where the last schedule or exclusions edit restarted the schedule: with `exclusions.action:
    /// NextAllowedDay`, a period at or before it that falls on an excluded day is not moved to a
    /// later day, because it was decided (run, or recorded) under the rules before the edit;
    /// moving it would run its business period again, or fire it retroactively.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shifts_after: Option<Time>,

    /// A period claimed (token issued) whose Job is not yet known to exist. Whoever acts next
    /// creates that Job, with the same name and token, before doing anything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_claim: Option<RunRef>,

    /// The scheduled instant of the latest started run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,

    /// When the latest successful run finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<Time>,

    /// Outcome of the latest finished or decided period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_result: Option<Outcome>,

    /// The next scheduled instant (RFC 3339), for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<String>,

    /// The next three scheduled instants.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub next_schedule_times: Vec<Time>,

    /// Number of active runs.
    #[serde(default)]
    pub active_count: i32,

    /// Runs whose Job exists and has not finished.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active: Vec<RunRef>,

    /// A run prepared ahead of its instant: claimed, its Job created suspended and confirmed,
    /// resumed at `resumeAt` and never before. Until then it is not active, its period is not
    /// decided (`decidedThrough`) and it counts in no history; anything that would change the
    /// period's decision (suspend, a schedule or template edit, deletion, a manual run, a
    /// broken lock) withdraws it: its Job never runs and is deleted, its token is retired, and
    /// the period is decided as it would have been without preparation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepared: Option<RunRef>,

    /// The most recent periods, newest first, with their outcome (bounded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,

    /// What became of the latest operation of each kind asked for through the annotations
    /// `singleton.dev/trigger`, `singleton.dev/backfill`, `singleton.dev/break-lock` and
    /// `singleton.dev/rerun` (which `kubectl singleton trigger|backfill|break-lock|rerun` set).
    #[serde(default, skip_serializing_if = "Operations::is_empty")]
    // Boxed: almost always empty, and every cached SingletonJob carries its status.
    pub operations: Box<Operations>,

    /// Since when the backstop has recorded a claim for every run of this SingletonJob, and in
    /// which database and tables (a hash; never the connection's values). For earlier periods
    /// the claims table may not know every run (the backstop was added or moved later, or a run
    /// started without its claim under `lock.purpose: Efficiency`), so backfill refuses them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims_recorded: Option<Box<ClaimsRecorded>>,

    /// Periods decided without a Job while the backstop stopped answering in the middle of their
    /// claim, so that the claim row may exist although no Job ran. Once the backstop answers,
    /// each such row is withdrawn and its token retired, so the claims table never says that a
    /// period ran when it did not (a backfill can then run it). At most 100 are kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub unsettled_claims: Vec<UnsettledClaim>,

    /// What `spec.notify` is told: the events still to deliver, and how each target fares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: empty without `spec.notify`, and every cached SingletonJob carries its status.
    pub notifications: Option<Box<Notifications>>,
    /// Fields of a newer release, kept as read so that this one's writes never drop them.
    #[serde(flatten)]
    #[schemars(skip)]
    pub unknown: Unknown,
}

/// A claim whose backstop row may exist although its period was decided without a Job (see
/// `unsettledClaims`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnsettledClaim {
    /// The period that was decided without a Job.
    pub period: MicroTime,
    /// The token of its claim, retired when the claim is withdrawn.
    #[schemars(schema_with = "token_schema")]
    pub token: u64,
    /// Fields of a newer release, kept as read so that this one's writes never drop them.
    #[serde(flatten)]
    #[schemars(skip)]
    pub unknown: Unknown,
}

/// See [`SingletonJobStatus::claims_recorded`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimsRecorded {
    /// Every run of a period after this instant has its claim row in the backstop.
    pub since: Time,
    /// Identifies the backstop database and table prefix the claims go to.
    pub target: String,
    /// Fields of a newer release, kept as read so that this one's writes never drop them.
    #[serde(flatten)]
    #[schemars(skip)]
    pub unknown: Unknown,
}

/// The latest operation of each kind. A request whose `id` equals the one recorded here has been
/// handled and is never acted on again.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Operations {
    /// The latest manual run (`kubectl singleton trigger`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<OperationStatus>,
    /// The latest backfill of past periods (`kubectl singleton backfill`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill: Option<OperationStatus>,
    /// The latest broken lock (`kubectl singleton break-lock`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub break_lock: Option<OperationStatus>,
    /// The latest re-run of a period (`kubectl singleton rerun`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun: Option<OperationStatus>,
    /// The latest repair of a range (`kubectl singleton rerun --from --to --only`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<OperationStatus>,
    /// The latest dry run of a repair (`kubectl singleton rerun --from --to --dry-run`): what it
    /// would re-run, decided by the same rules; nothing run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_dry_run: Option<OperationStatus>,
    /// Fields of a newer release, kept as read so that this one's writes never drop them.
    #[serde(flatten)]
    #[schemars(skip)]
    pub unknown: Unknown,
}

impl Operations {
    pub fn is_empty(&self) -> bool {
        self.trigger.is_none()
            && self.backfill.is_none()
            && self.break_lock.is_none()
            && self.rerun.is_none()
            && self.repair.is_none()
            && self.repair_dry_run.is_none()
            && self.unknown.is_empty()
    }
}

/// One operation asked for by a user, and how far the controller got with it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationStatus {
    /// The request's id, as written in its annotation.
    pub id: String,
    /// Pending (accepted, waiting to start), Running (a backfill in progress), Done or Rejected.
    pub phase: OperationPhase,
    /// Who asked, as the requester's client reported it (`kubectl singleton` writes the
    /// authenticated user name from a SelfSubjectReview).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Why, as the requester wrote it (required for break-lock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What happened, for humans.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Backfill: the first period of the range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Time>,
    /// Backfill: the last period of the range (inclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Time>,
    /// Rerun: the period run again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Time>,
    /// Backfill: every period of the range before this instant has been considered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Time>,
    /// Backfill: runs started; trigger: 1 once its run started.
    #[serde(default)]
    #[schemars(schema_with = "token_schema")]
    pub started: u64,
    /// Backfill: periods of the range that had run before (the backstop holds their claim).
    #[serde(default)]
    #[schemars(schema_with = "token_schema")]
    pub already_run: u64,
    /// Trigger and rerun: the run's Job; break-lock: unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// Trigger and rerun: the run's token; break-lock: the token the fence was raised to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_token_schema")]
    pub token: Option<u64>,
    /// Repair: which periods of the range it re-runs (Failed, Missed or All).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only: Option<RepairOnly>,
    /// Repair: the order it walks the range in (Oldest or Newest first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<RepairOrder>,
    /// Repair: at most this many of its runs active at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "parallel_schema")]
    pub parallel: Option<u32>,
    /// Repair: periods of the range it does not re-run (their records do not match `only`,
    /// their run is still active, or an identical request re-ran them).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(schema_with = "token_schema")]
    pub passed: u64,
    /// Repair dry run: how many periods the repair would re-run now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_token_schema")]
    pub selected: Option<u64>,
    /// Repair dry run: the periods it would re-run, in its order (the first 100).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub periods: Vec<MicroTime>,
    /// When the controller last changed this record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<Time>,
    /// Fields of a newer release, kept as read so that this one's writes never drop them.
    #[serde(flatten)]
    #[schemars(skip)]
    pub unknown: Unknown,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Which periods of its range a repair re-runs, by what their records say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RepairOnly {
    /// Periods whose latest run failed (or was replaced before it finished).
    #[default]
    Failed,
    /// Periods that never ran (recorded Missed or Skipped, or no run at all).
    Missed,
    /// Every decided period of the range whose run is not active.
    All,
}

/// The order in which a repair walks its range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RepairOrder {
    /// The oldest period first.
    #[default]
    Oldest,
    /// The newest period first.
    Newest,
}

/// Progress of an operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OperationPhase {
    /// Accepted; waits for an active run to finish (or for the clock or backstop).
    #[default]
    Pending,
    /// A backfill with periods still to start.
    Running,
    /// Finished: the run started, the backfill went through its range, the lock was broken.
    Done,
    /// Not carried out; `message` says why.
    Rejected,
}

/// How a run came about, when not by the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RunOrigin {
    /// `kubectl singleton trigger`: a manual period at the time of its claim.
    Trigger,
    /// `kubectl singleton backfill`: a past scheduled period that had not run.
    Backfill,
    /// `kubectl singleton rerun`: a decided period run again, with a new token that fences the
    /// earlier run out, under a Job name of its own.
    Rerun,
}

impl RunOrigin {
    /// The reason recorded with the run's history entry.
    pub fn reason(self) -> &'static str {
        match self {
            RunOrigin::Trigger => "Triggered",
            RunOrigin::Backfill => "Backfill",
            RunOrigin::Rerun => "Rerun",
        }
    }
}

/// One run: its period, token and Job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunRef {
    /// The scheduled instant this run is for (a manual run's carries microseconds: it names the
    /// run's Job and backstop claim, so it is kept exactly).
    pub period: MicroTime,
    /// The fencing token issued to this run.
    #[schemars(schema_with = "token_schema")]
    pub token: u64,
    /// Name of the Job (deterministic per SingletonJob and period).
    pub job_name: String,
    /// When the claim was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_at: Option<Time>,
    /// The uid of the run's Job once it exists: tells this run's Job from a later re-creation
    /// under the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_uid: Option<String>,
    /// Trigger, Backfill or Rerun for a run asked for by a user; unset for a scheduled run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<RunOrigin>,
    /// Who asked for this run (a trigger, backfill or rerun), as the request said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Pending claims of a rerun only: the token of the period's claim row in the backstop that
    /// this claim takes over (a compare-and-swap from it to this run's token), so the period keeps
    /// one claim row and the earlier run is fenced out. Unset when the backstop had no row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_token_schema")]
    pub supersedes: Option<u64>,
    /// Pending claims only (concurrencyPolicy Replace): the active runs this run replaces. Kept
    /// with the claim so that whoever completes it, after a failure or a failover, deletes them
    /// before this run's Job may start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<ReplacedRun>,
    /// The run had not succeeded by its completion deadline (`completionDeadlineSeconds`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub late: bool,
    /// Prepared runs (and the pending claim that prepares one) only: when the run's Job may be
    /// resumed, by the API server's clock: the period plus its jitter. Never earlier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_at: Option<MicroTime>,
    /// Prepared runs only: short hashes of what the run was decided and built from
    /// (`fp:<schedule, time zone, exclusions, calendars>/spec:<jobTemplate, deadlines, backstop,
    /// lock, startAt, endAt>`). An edit that changes either withdraws the prepared run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<String>,
    /// Fields of a newer release, kept as read so that this one's writes never drop them.
    #[serde(flatten)]
    #[schemars(skip)]
    pub unknown: Unknown,
}

/// A run that a pending claim replaces (concurrencyPolicy Replace).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplacedRun {
    /// The replaced run's period.
    pub period: MicroTime,
    /// The replaced run's fencing token.
    #[schemars(schema_with = "token_schema")]
    pub token: u64,
    /// The replaced run's Job.
    pub job_name: String,
    /// The replaced run's Job uid, when known: only that Job is deleted, never a later one of
    /// the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_uid: Option<String>,
    /// When the replaced run was claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_at: Option<Time>,
    /// Fields of a newer release, kept as read so that this one's writes never drop them.
    #[serde(flatten)]
    #[schemars(skip)]
    pub unknown: Unknown,
}

impl From<&RunRef> for ReplacedRun {
    fn from(r: &RunRef) -> Self {
        ReplacedRun {
            unknown: Default::default(),
            period: r.period.clone(),
            token: r.token,
            job_name: r.job_name.clone(),
            job_uid: r.job_uid.clone(),
            claimed_at: r.claimed_at.clone(),
        }
    }
}

/// What happened to a period.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum Outcome {
    /// The run is active.
    Running,
    /// The Job completed.
    Succeeded,
    /// The Job failed (or was deleted before it finished).
    Failed,
    /// The period was deliberately not run (suspend, Forbid with catchUp None).
    Skipped,
    /// The period could not be started in time (deadline, superseded by a newer period).
    Missed,
    /// The run was fenced and deleted for a newer one (concurrencyPolicy Replace).
    Replaced,
    /// The backstop database already holds a claim for this period: it ran before (for example
    /// before the SingletonJob was re-created), so no Job was created.
    Deduplicated,
}

impl Outcome {
    /// The variant's name, as in the API (and in metric labels and Event reasons).
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Running => "Running",
            Outcome::Succeeded => "Succeeded",
            Outcome::Failed => "Failed",
            Outcome::Skipped => "Skipped",
            Outcome::Missed => "Missed",
            Outcome::Replaced => "Replaced",
            Outcome::Deduplicated => "Deduplicated",
        }
    }

    /// The outcome of a name; None for a name this build does not know (a newer release's).
    pub fn named(name: &str) -> Option<Outcome> {
        [
            Outcome::Running,
            Outcome::Succeeded,
            Outcome::Failed,
            Outcome::Skipped,
            Outcome::Missed,
            Outcome::Replaced,
            Outcome::Deduplicated,
        ]
        .into_iter()
        .find(|o| o.name() == name)
    }
}

/// A period and its outcome. Consecutive periods with the same outcome and reason that were never
/// started are folded into one entry with `count` > 1 (from `period` to `lastPeriod`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    /// The scheduled instant (the first of a folded range); a manual run's, with microseconds.
    pub period: MicroTime,
    /// The last scheduled instant of a folded range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_period: Option<Time>,
    /// How many periods this entry stands for.
    #[serde(default = "one")]
    #[schemars(schema_with = "count_schema")]
    pub count: u64,
    /// What happened.
    pub outcome: Outcome,
    /// Why, as a CamelCase word (DeadlineExceeded, Superseded, Suspended, ConcurrencyForbid, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The run's Job, if one was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// The run's fencing token, if one was issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_token_schema")]
    pub token: Option<u64>,
    /// When the run started (claim time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the run finished, or when the outcome was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_time: Option<Time>,
    /// The run had not succeeded by its completion deadline (`completionDeadlineSeconds`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub late: bool,
    /// Who asked for the run (trigger, backfill, rerun), as the request said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Multi-cluster: the identity (`--cluster-id`) of the other cluster that claimed the period
    /// in the shared backstop and runs it there (reason `ClaimedElsewhere`), or that had claimed
    /// a later period first (reason `Superseded`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// More about the reason, for people: for periods a suspension skipped, until when, by whom
    /// and why (`spec.suspension`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Fields of a newer release, kept as read so that this one's writes never drop them.
    #[serde(flatten)]
    #[schemars(skip)]
    pub unknown: Unknown,
}

fn one() -> u64 {
    1
}

impl SingletonJob {
    /// What the lock is for (`spec.lock.purpose`, default Correctness).
    pub fn purpose(&self) -> LockPurpose {
        self.spec
            .lock
            .as_ref()
            .map(|l| l.purpose)
            .unwrap_or_default()
    }

    /// `namespace/name`, the value of SINGLETON_JOB.
    /// The job's name in the backstop database: `spec.backstop.jobKey`, else [`Self::key`].
    pub fn backstop_key(&self) -> String {
        self.spec
            .backstop
            .as_ref()
            .and_then(|b| b.job_key.clone())
            .unwrap_or_else(|| self.key())
    }

    /// How far after `period`'s instant its run starts within `jitterSeconds`: derived from the
    /// backstop's job key and the period, so every replica and restart picks the same offset,
    /// and so do two clusters' SingletonJobs of one `jobKey` under different names (F8).
    pub fn jitter(&self, period: jiff::Timestamp) -> jiff::SignedDuration {
        crate::schedule::jitter(&self.backstop_key(), period, self.spec.jitter_window())
    }

    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Version skew (issue 36): a status written by a newer release, with fields this one does
    /// not know at every level it has, is written back by this one unchanged; and the CRD's
    /// schema does not describe them (the newer release's CRD does).
    #[test]
    fn a_newer_release_status_round_trips_with_its_unknown_fields() {
        let run = serde_json::json!({
            "period": "2030-01-01T00:00:00.000000Z", "token": 7, "jobName": "a-1",
            "preparedFor": "2030-01-01T00:00:00Z",
            "replaces": [{"period": "2029-12-31T00:00:00.000000Z", "token": 6, "jobName": "a-0",
                          "attemptUids": ["x"]}],
        });
        let op = serde_json::json!({"id": "r1", "phase": "Done", "started": 1, "alreadyRun": 0,
                                    "dryRunOf": "r0"});
        let v = serde_json::json!({
            "fencingToken": 7,
            "activeCount": 1,
            "active": [run.clone()],
            "pendingClaim": run,
            "history": [{"period": "2030-01-01T00:00:00.000000Z", "count": 1,
                         "outcome": "Succeeded", "attemptsCommitted": 2}],
            "operations": {"trigger": op, "pause": {"until": "2031-01-01T00:00:00Z"}},
            "claimsRecorded": {"since": "2030-01-01T00:00:00Z", "target": "t", "engine": "pg"},
            "unsettledClaims": [{"period": "2030-01-01T00:00:00.000000Z", "token": 3,
                                 "withdrawnAt": "2030-01-01T00:00:01Z"}],
            "preparedRun": {"period": "2030-01-02T00:00:00Z", "token": 8},
        });
        let status: SingletonJobStatus = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(
            status.unknown.keys().collect::<Vec<_>>(),
            vec!["preparedRun"]
        );
        assert_eq!(serde_json::to_value(&status).unwrap(), v);
        let schema = serde_json::to_string(&crd()).unwrap();
        for unknown in ["preparedRun", "preparedFor", "attemptsCommitted", "unknown"] {
            assert!(
                !schema.contains(&format!("\"{unknown}\"")),
                "{unknown} in the CRD"
            );
        }
    }

    #[test]
    fn job_template_round_trips_as_structure_not_text() {
        let v = serde_json::json!({"spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
        }}}});
        let t: JobTemplate = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&t).unwrap(), v);
        let yaml = serde_yaml::to_string(&t).unwrap();
        assert!(yaml.contains("backoffLimit: 0"), "{yaml}");
        assert_eq!(t.decode().unwrap().spec.unwrap().backoff_limit, Some(0));
        // Key order does not matter to equality.
        let u: JobTemplate = serde_json::from_str(
            r#"{"spec":{"template":{"spec":{"containers":[{"command":["true"],"image":"busybox","name":"main"}],"restartPolicy":"Never"}},"backoffLimit":0}}"#,
        )
        .unwrap();
        assert_eq!(t, u);
    }

    #[test]
    fn an_oversize_template_is_refused_and_not_kept() {
        let big = "x".repeat(1024 * 1024);
        let sj: SingletonJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "singleton.dev/v1alpha1", "kind": "SingletonJob",
            "metadata": {"name": "x"},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {
                "metadata": {"annotations": {"big": big}}}}}},
        }))
        .unwrap();
        // The cached object holds none of the megabyte.
        assert_eq!(sj.spec.job_template.held_bytes(), 0);
        let err = sj.spec.job_template.decode().unwrap_err();
        assert!(err.contains("more than the limit of 65536 bytes"), "{err}");
        // Never written back as something else.
        assert!(serde_json::to_string(&sj).is_err());
        // At the limit it is kept; one byte over, it is not.
        let at = |n: usize| {
            let pad = "x".repeat(n - r#"{"a":""}"#.len());
            JobTemplate::from(serde_json::json!({ "a": pad }))
        };
        assert_eq!(
            at(MAX_JOB_TEMPLATE_BYTES).held_bytes(),
            MAX_JOB_TEMPLATE_BYTES
        );
        assert!(at(MAX_JOB_TEMPLATE_BYTES).decode().is_ok());
        assert_eq!(at(MAX_JOB_TEMPLATE_BYTES + 1).held_bytes(), 0);
    }

    #[test]
    fn a_wrongly_typed_template_still_decodes_the_object() {
        let sj: SingletonJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "singleton.dev/v1alpha1", "kind": "SingletonJob",
            "metadata": {"name": "x"},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"backoffLimit": "many"}}},
        }))
        .unwrap();
        let err = sj.spec.job_template.decode().unwrap_err();
        assert!(
            err.contains("not a valid batch/v1 JobTemplateSpec"),
            "{err}"
        );
        // No template at all is not a template either.
        assert!(JobTemplate::default().decode().is_err());
    }
}
