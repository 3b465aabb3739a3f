//! `kubectl singleton list|status|history|suspend|resume|trigger|backfill|break-lock`: the plugin's
//! commands against the API server, and the pure rendering of SingletonJobs to text (tested
//! without a cluster). The operations (trigger, backfill, break-lock) only ask: they write a
//! request annotation and wait for the controller to record what it did (see [`crate::decide::ops`]).

use std::fmt::Write as _;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};

use crate::api::{HistoryEntry, OperationPhase, OperationStatus, Outcome, SingletonJob};
use crate::decide::ops::{self, OperationKind, Request};

/// The resource as kubectl and RBAC name it.
const RESOURCE: &str = "singletonjobs.singleton.dev";

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

/// What can go wrong in a plugin command; each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("SingletonJob {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("the SingletonJob CRD is not installed: kubectl apply -f crds/")]
    CrdMissing,
    #[error("forbidden: you may not {verb} {RESOURCE}{scope}: {message}")]
    Forbidden {
        verb: String,
        scope: String,
        message: String,
    },
    #[error(
        "cannot reach the Kubernetes API server{server}: {detail}; check KUBECONFIG (or ~/.kube/config) and that the cluster runs"
    )]
    Unreachable { server: String, detail: String },
    #[error(
        "cannot load a kubeconfig: {0}; set KUBECONFIG to a kubeconfig file (or create ~/.kube/config)"
    )]
    NoConfig(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[source] kube::Error),
    #[error("encoding output: {0}")]
    Encode(String),
    /// A request of the same kind is not finished; overwriting it would lose it.
    #[error("{0}")]
    Busy(String),
    /// Nobody acted on the request in time.
    #[error("{0}")]
    NoController(String),
    #[error("{command} rejected by the controller: {message}")]
    Rejected {
        command: &'static str,
        message: String,
    },
    #[error("{0}")]
    Usage(String),
}

/// A client and the namespace the kubeconfig's context selects.
pub struct Conn {
    pub client: Client,
    /// The context's namespace (`default` if it names none).
    pub default_namespace: String,
    server: String,
}

impl Conn {
    /// From KUBECONFIG / ~/.kube/config / in-cluster, as kubectl does.
    pub async fn infer() -> Result<Conn, PluginError> {
        let config = kube::Config::infer()
            .await
            .map_err(|e| PluginError::NoConfig(e.to_string()))?;
        let server = format!(" at {}", config.cluster_url);
        let default_namespace = config.default_namespace.clone();
        let client = Client::try_from(config).map_err(|e| PluginError::NoConfig(e.to_string()))?;
        Ok(Conn {
            client,
            default_namespace,
            server,
        })
    }

    fn err(&self, e: kube::Error, verb: &str, ns: Option<&str>) -> PluginError {
        match e {
            kube::Error::Api(s) if s.code == 403 => PluginError::Forbidden {
                verb: verb.into(),
                scope: match ns {
                    Some(ns) => format!(" in namespace {ns}"),
                    None => " in all namespaces".into(),
                },
                message: s.message.clone(),
            },
            e @ (kube::Error::HyperError(_) | kube::Error::Service(_)) => {
                PluginError::Unreachable {
                    server: self.server.clone(),
                    detail: error_chain(&e),
                }
            }
            e => PluginError::Kube(e),
        }
    }

    /// Whether the SingletonJob resource is served (a list in `ns` is not a 404).
    async fn crd_installed(&self, ns: &str) -> Result<bool, PluginError> {
        let api: Api<SingletonJob> = Api::namespaced(self.client.clone(), ns);
        match api.list_metadata(&ListParams::default().limit(1)).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(self.err(e, "list", Some(ns))),
        }
    }

    /// One SingletonJob, or an error that tells a missing object from a missing CRD.
    pub async fn get(&self, ns: &str, name: &str) -> Result<SingletonJob, PluginError> {
        let api: Api<SingletonJob> = Api::namespaced(self.client.clone(), ns);
        match api.get(name).await {
            Ok(sj) => Ok(sj),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                if self.crd_installed(ns).await? {
                    Err(PluginError::NotFound {
                        namespace: ns.into(),
                        name: name.into(),
                    })
                } else {
                    Err(PluginError::CrdMissing)
                }
            }
            Err(e) => Err(self.err(e, "get", Some(ns))),
        }
    }

    /// SingletonJobs of `ns`, or of all namespaces when `None`, sorted by namespace and name.
    pub async fn list(&self, ns: Option<&str>) -> Result<Vec<SingletonJob>, PluginError> {
        let api: Api<SingletonJob> = match ns {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let mut items = match api.list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(kube::Error::Api(s)) if s.code == 404 => return Err(PluginError::CrdMissing),
            Err(e) => return Err(self.err(e, "list", ns)),
        };
        items.sort_by_key(|s| (s.namespace().unwrap_or_default(), s.name_any()));
        Ok(items)
    }

    /// Sets `spec.suspend` by a merge patch; returns what changed, for the user.
    pub async fn set_suspend(
        &self,
        ns: &str,
        name: &str,
        suspend: bool,
    ) -> Result<String, PluginError> {
        let before = self.get(ns, name).await?;
        let was = before.spec.suspend.unwrap_or(false);
        let verb = if suspend { "suspended" } else { "resumed" };
        if was == suspend {
            return Ok(format!(
                "singletonjob {ns}/{name} already {verb} (spec.suspend is {suspend})\n"
            ));
        }
        let api: Api<SingletonJob> = Api::namespaced(self.client.clone(), ns);
        let patch = serde_json::json!({"spec": {"suspend": suspend}});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(format!(
                "singletonjob {ns}/{name} {verb} (spec.suspend: {was} -> {suspend})\n"
            )),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(PluginError::NotFound {
                namespace: ns.into(),
                name: name.into(),
            }),
            Err(e) => Err(self.err(e, "patch", Some(ns))),
        }
    }
}

/// How long an operation command waits, and for what.
#[derive(Clone, Copy, Debug)]
pub struct Wait {
    /// Give up after this long.
    pub timeout: std::time::Duration,
    /// Backfill: wait until the whole range is done, not only until it is accepted.
    pub until_done: bool,
}

impl Conn {
    /// The authenticated user name, as the API server sees us (a SelfSubjectReview), for the
    /// request's record. None if the cluster does not answer it.
    pub async fn whoami(&self) -> Option<String> {
        use k8s_openapi::api::authentication::v1::SelfSubjectReview;
        let api: Api<SelfSubjectReview> = Api::all(self.client.clone());
        let review = api
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .ok()?;
        review.status?.user_info?.username
    }

    /// Asks the controller for an operation: writes `req` into its annotation (guarded by the
    /// object's resourceVersion, so a concurrent request is never overwritten unseen), then polls
    /// `status.operations` until the controller records it. Returns the record.
    pub async fn operate(
        &self,
        ns: &str,
        name: &str,
        kind: OperationKind,
        req: Request,
        wait: Wait,
    ) -> Result<OperationStatus, PluginError> {
        let api: Api<SingletonJob> = Api::namespaced(self.client.clone(), ns);
        // A few tries: the controller writes the status all the time, which changes the
        // resourceVersion the patch is guarded by.
        let mut tries = 0;
        loop {
            tries += 1;
            let sj = self.get(ns, name).await?;
            check_not_busy(&sj, kind)?;
            if kind == OperationKind::Backfill && sj.spec.backstop.is_none() {
                return Err(PluginError::Rejected {
                    command: kind.command(),
                    message: "backfill needs spec.backstop: only the backstop's claims table remembers every period that ever ran".into(),
                });
            }
            let value =
                serde_json::to_string(&req).map_err(|e| PluginError::Encode(e.to_string()))?;
            let patch = serde_json::json!({"metadata": {
                "resourceVersion": sj.resource_version(),
                "annotations": {kind.annotation(): value},
            }});
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => break,
                Err(kube::Error::Api(s)) if s.code == 409 && tries < 5 => continue,
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    return Err(PluginError::NotFound {
                        namespace: ns.into(),
                        name: name.into(),
                    });
                }
                Err(e) => return Err(self.err(e, "patch", Some(ns))),
            }
        }

        let deadline = tokio::time::Instant::now() + wait.timeout;
        let mut seen: Option<OperationStatus> = None;
        loop {
            let sj = self.get(ns, name).await?;
            let op = sj
                .status
                .as_ref()
                .and_then(|s| kind.slot(&s.operations))
                .filter(|o| o.id == req.id)
                .cloned();
            if let Some(op) = &op {
                let finished = match op.phase {
                    OperationPhase::Done => true,
                    OperationPhase::Rejected => {
                        return Err(PluginError::Rejected {
                            command: kind.command(),
                            message: op.message.clone(),
                        });
                    }
                    // A backfill under way has been accepted: enough unless asked to wait.
                    OperationPhase::Running => !wait.until_done,
                    OperationPhase::Pending => false,
                };
                if finished {
                    return Ok(op.clone());
                }
            }
            seen = op.or(seen);
            if tokio::time::Instant::now() >= deadline {
                return match seen {
                    // Accepted and waiting (for a run to finish, the clock, the backstop): the
                    // controller carries it out; say what it waits for.
                    Some(op) => Ok(op),
                    None => Err(PluginError::NoController(format!(
                        "no controller acted on the {cmd} request within {secs}s: is singleton-controller running, and does it watch namespace {ns}? The request stays in annotation {key} and is carried out when a controller sees it; withdraw it with: kubectl annotate singletonjob {name} -n {ns} {key}-",
                        cmd = kind.command(),
                        secs = wait.timeout.as_secs(),
                        key = kind.annotation(),
                    ))),
                };
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }
}

/// Refuses to overwrite a request of the same kind the controller has not finished with.
fn check_not_busy(sj: &SingletonJob, kind: OperationKind) -> Result<(), PluginError> {
    let ns = sj.namespace().unwrap_or_default();
    let name = sj.name_any();
    let busy = |id: String, state: String| {
        PluginError::Busy(format!(
            "a {cmd} request ({id}) on {ns}/{name} is not finished: {state}; wait for it (kubectl singleton status {name} -n {ns}) or withdraw it: kubectl annotate singletonjob {name} -n {ns} {key}-",
            cmd = kind.command(),
            key = kind.annotation(),
        ))
    };
    let recorded = sj.status.as_ref().and_then(|s| kind.slot(&s.operations));
    if let Some(Ok(req)) = ops::pending(sj, kind) {
        let state = match recorded.filter(|o| o.id == req.id) {
            Some(o) => format!("accepted, {}", o.message),
            None => "not yet seen by a controller".into(),
        };
        return Err(busy(req.id, state));
    }
    if let Some(o) = recorded.filter(|o| o.phase == OperationPhase::Running) {
        return Err(busy(o.id.clone(), format!("in progress, {}", o.message)));
    }
    Ok(())
}

/// A new request: its id is the time of asking, with microseconds.
pub fn new_request(by: Option<String>, now: Timestamp) -> Request {
    Request {
        id: crate::naming::period_rfc3339(crate::naming::manual_period(now)),
        by,
        ..Request::default()
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
        (OperationKind::Backfill, OperationPhase::Done) => {
            format!("singletonjob {ns}/{name}: backfill done")
        }
        (OperationKind::Backfill, OperationPhase::Running) => {
            format!("singletonjob {ns}/{name}: backfill accepted")
        }
        (_, _) => format!(
            "singletonjob {ns}/{name}: {} accepted, not done yet",
            kind.command()
        ),
    };
    Ok(format!("{head}: {} (request {})\n", op.message, op.id))
}

/// An error and its sources, outermost first ("client error (Connect): Connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out = format!("{out}: {text}");
        }
        cur = s.source();
    }
    out
}

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

/// Left-aligned columns separated by three spaces, as kubectl prints them.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let header_row: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header_row).chain(rows) {
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

/// A period: seconds for a scheduled one, microseconds for a manual one.
fn period(t: &MicroTime) -> String {
    crate::naming::period_rfc3339(t.0)
}

fn opt_ts(t: Option<&Time>) -> String {
    t.map(ts).unwrap_or_else(|| "-".into())
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
        "TOKEN",
    ];
    if all_namespaces {
        headers.insert(0, "NAMESPACE");
    }
    let rows: Vec<Vec<String>> = sjs
        .iter()
        .map(|sj| {
            let st = sj.status.clone().unwrap_or_default();
            let mut row = vec![
                sj.name_any(),
                sj.spec.schedule.clone(),
                sj.spec.suspend.unwrap_or(false).to_string(),
                st.active_count.to_string(),
                st.last_result.map(outcome).unwrap_or_else(|| "-".into()),
                st.last_schedule_time
                    .as_ref()
                    .map(|t| format!("{} ago", age(t.0, now)))
                    .unwrap_or_else(|| "-".into()),
                dash(st.next_schedule_time.as_deref()),
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

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

fn conditions_table(conditions: &[Condition], now: Timestamp) -> String {
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
    table(&["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"], &rows)
}

/// How many history entries `status` shows.
pub const STATUS_HISTORY: usize = 10;

/// The `status` summary: spec, conditions, active runs, next times, recent history.
pub fn render_status(sj: &SingletonJob, now: Timestamp) -> String {
    let spec = &sj.spec;
    let st = sj.status.clone().unwrap_or_default();
    let mut out = String::new();
    let backstop = match spec.backstop.as_ref().and_then(|b| b.postgres.as_ref()) {
        Some(pg) => format!("on (postgres, secret {})", pg.secret_ref.name),
        None => "off".into(),
    };
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
        ("Backstop", backstop),
        ("Suspend", spec.suspend.unwrap_or(false).to_string()),
        ("Fencing Token", st.fencing_token.to_string()),
        (
            "Last Result",
            st.last_result.map(outcome).unwrap_or_else(|| "-".into()),
        ),
        ("Last Schedule", opt_ts(st.last_schedule_time.as_ref())),
        ("Last Success", opt_ts(st.last_successful_time.as_ref())),
    ];
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    for (k, v) in fields {
        let _ = writeln!(out, "{:<width$} {v}", format!("{k}:"));
    }

    out.push_str("Conditions:\n");
    if st.conditions.is_empty() {
        out.push_str("  <none>\n");
    } else {
        out += &indent(&conditions_table(&st.conditions, now));
    }

    out.push_str("Active Runs:\n");
    if st.active.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let rows: Vec<Vec<String>> = st
            .active
            .iter()
            .map(|r| vec![r.job_name.clone(), period(&r.period), r.token.to_string()])
            .collect();
        out += &indent(&table(&["JOB", "PERIOD", "TOKEN"], &rows));
    }

    out.push_str("Next Schedule Times:\n");
    if st.next_schedule_times.is_empty() {
        out.push_str("  <none>\n");
    } else {
        for t in st.next_schedule_times.iter().take(3) {
            let _ = writeln!(out, "  {}", ts(t));
        }
    }

    let shown = st.history.len().min(STATUS_HISTORY);
    let _ = writeln!(
        out,
        "History (last {shown} of {}, newest first):",
        st.history.len()
    );
    if st.history.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let rows: Vec<Vec<String>> = st
            .history
            .iter()
            .take(STATUS_HISTORY)
            .map(|h| {
                vec![
                    period(&h.period),
                    count(h),
                    outcome(h.outcome),
                    dash(h.reason.as_deref()),
                    dash(h.job_name.as_deref()),
                    token(h),
                ]
            })
            .collect();
        out += &indent(&table(
            &["PERIOD", "COUNT", "OUTCOME", "REASON", "JOB", "TOKEN"],
            &rows,
        ));
    }

    let ops = &st.operations;
    if !ops.is_empty() {
        out.push_str("Operations:\n");
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
        out += &indent(&table(
            &["OPERATION", "PHASE", "BY", "UPDATED", "MESSAGE"],
            &rows,
        ));
    }
    out
}

fn count(h: &HistoryEntry) -> String {
    h.count.to_string()
}

fn token(h: &HistoryEntry) -> String {
    h.token.map(|t| t.to_string()).unwrap_or_else(|| "-".into())
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
                dash(h.reason.as_deref()),
                dash(h.job_name.as_deref()),
                token(h),
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
            "START",
            "FINISH",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{RunRef, SingletonJobSpec, SingletonJobStatus};

    fn t(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    fn entry(period: &str, o: Outcome, token: Option<u64>, reason: Option<&str>) -> HistoryEntry {
        HistoryEntry {
            period: t(period).0.into(),
            last_period: None,
            count: 1,
            outcome: o,
            reason: reason.map(String::from),
            job_name: token.map(|_| "hello-1".into()),
            token,
            start_time: token.map(|_| t(period)),
            finish_time: Some(t(period)),
        }
    }

    fn sj() -> SingletonJob {
        let spec: SingletonJobSpec = serde_json::from_value(serde_json::json!({
            "schedule": "*/5 * * * *",
            "timeZone": "Europe/Berlin",
            "jobTemplate": {}
        }))
        .unwrap();
        let mut sj = SingletonJob::new("hello", spec);
        sj.metadata.namespace = Some("team-a".into());
        sj.status = Some(SingletonJobStatus {
            fencing_token: 7,
            active_count: 1,
            last_result: Some(Outcome::Succeeded),
            last_schedule_time: Some(t("2026-01-01T00:05:00Z")),
            next_schedule_time: Some("2026-01-01T00:10:00Z".into()),
            next_schedule_times: vec![
                t("2026-01-01T00:10:00Z"),
                t("2026-01-01T00:15:00Z"),
                t("2026-01-01T00:20:00Z"),
            ],
            active: vec![RunRef {
                period: t("2026-01-01T00:05:00Z").0.into(),
                token: 7,
                job_name: "hello-1767225900".into(),
                claimed_at: None,
                job_uid: None,
                origin: None,
                replaces: Vec::new(),
            }],
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "Scheduled".into(),
                message: "all good".into(),
                observed_generation: Some(1),
                last_transition_time: t("2026-01-01T00:00:00Z"),
            }],
            history: (0..12)
                .map(|i| {
                    entry(
                        &format!("2026-01-01T00:{:02}:00Z", 55 - i * 5),
                        Outcome::Succeeded,
                        Some(20 - i as u64),
                        None,
                    )
                })
                .collect(),
            ..Default::default()
        });
        sj
    }

    fn now() -> Timestamp {
        "2026-01-01T00:06:30Z".parse().unwrap()
    }

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
    fn operations_are_shown_and_a_pending_one_is_not_overwritten() {
        use crate::api::{ANNOTATION_TRIGGER, Operations};
        let mut s = sj();
        let req = new_request(Some("alice".into()), now());
        assert!(req.id.contains('.'), "microseconds in {}", req.id);
        let mut done = ops::accepted(&req, now());
        done.phase = OperationPhase::Done;
        done.message = "started Job hello-1-000001 with fencing token 21".into();
        *s.status.as_mut().unwrap().operations = Operations {
            trigger: Some(done.clone()),
            ..Default::default()
        };
        let out = render_status(&s, now());
        let ops_part = out.split("Operations:").nth(1).expect(&out);
        for want in ["trigger", "Done", "alice", "fencing token 21"] {
            assert!(ops_part.contains(want), "{want:?} in\n{out}");
        }
        let line =
            format_operation(OperationKind::Trigger, "ns", "hello", &done, Output::Table).unwrap();
        assert!(
            line.starts_with("singletonjob ns/hello triggered: started Job"),
            "{line}"
        );
        let json =
            format_operation(OperationKind::Trigger, "ns", "hello", &done, Output::Json).unwrap();
        assert_eq!(
            serde_json::from_str::<OperationStatus>(&json).unwrap(),
            done
        );

        // The handled request in the annotation: a new one may be written.
        let raw = serde_json::to_string(&req).unwrap();
        s.metadata.annotations = Some([(ANNOTATION_TRIGGER.to_string(), raw)].into());
        assert!(check_not_busy(&s, OperationKind::Trigger).is_ok());
        // Accepted but waiting, or never seen: refused, saying how to withdraw it.
        let mut waiting = done.clone();
        waiting.phase = OperationPhase::Pending;
        waiting.message = "waiting for the active run x to finish".into();
        s.status.as_mut().unwrap().operations.trigger = Some(waiting);
        let e = check_not_busy(&s, OperationKind::Trigger)
            .unwrap_err()
            .to_string();
        assert!(e.contains("accepted, waiting for the active run"), "{e}");
        assert!(e.contains("singleton.dev/trigger-"), "{e}");
        s.status.as_mut().unwrap().operations.trigger = None;
        let e = check_not_busy(&s, OperationKind::Trigger)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not yet seen by a controller"), "{e}");
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
        let out = render_history(&h);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].starts_with("PERIOD   "), "{out}");
        assert!(lines[0].ends_with("FINISH"), "{out}");
        let skipped: Vec<&str> = lines[2].split("   ").map(str::trim).collect();
        assert!(skipped.contains(&"Skipped"), "{skipped:?}");
        assert!(skipped.contains(&"Suspended"), "{skipped:?}");
        assert!(skipped.contains(&"5"), "{skipped:?}");
        assert!(skipped.contains(&"2026-01-01T00:04:00Z"), "{skipped:?}");
        assert!(lines[1].contains("   2   "), "{out}");
        assert_eq!(render_history(&[]), "No history yet.\n");
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
        let list = format_list(&[s], false, Output::Json, now()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&list).unwrap();
        assert_eq!(v["kind"], "List");
        assert_eq!(v["items"][0]["metadata"]["name"], "hello");
        assert_eq!("yaml".parse::<Output>(), Ok(Output::Yaml));
        assert!("xml".parse::<Output>().is_err());
    }

    /// A client against a fake API server that answers every request with `reply(method, path)`.
    fn fake(reply: fn(&http::Method, &str) -> (u16, String)) -> Conn {
        use http::{Request, Response};
        use kube::client::Body;
        let server = tower::service_fn(move |req: Request<Body>| async move {
            let (code, body) = reply(req.method(), req.uri().path());
            Ok::<_, kube::Error>(
                Response::builder()
                    .status(code)
                    .body(Body::from(body.into_bytes()))
                    .unwrap(),
            )
        });
        Conn {
            client: Client::new(server, "default"),
            default_namespace: "default".into(),
            server: " at https://fake".into(),
        }
    }

    fn status_body(code: u16, reason: &str) -> String {
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": reason, "message": format!("{reason} by the fake"), "code": code})
        .to_string()
    }

    const EMPTY_LIST: &str = r#"{"apiVersion":"singleton.dev/v1alpha1","kind":"SingletonJobList","metadata":{},"items":[]}"#;

    #[tokio::test]
    async fn a_missing_object_is_told_from_a_missing_crd() {
        // The resource is served, the object is not there.
        let conn = fake(|m, path| match (m, path) {
            (&http::Method::GET, "/apis/singleton.dev/v1alpha1/namespaces/ns/singletonjobs") => {
                (200, EMPTY_LIST.into())
            }
            _ => (404, status_body(404, "NotFound")),
        });
        let e = conn.get("ns", "x").await.unwrap_err();
        assert_eq!(e.to_string(), "SingletonJob ns/x not found");
        let e = conn.set_suspend("ns", "x", true).await.unwrap_err();
        assert_eq!(e.to_string(), "SingletonJob ns/x not found");

        // The API server does not know the resource at all (its plain-text 404).
        let conn = fake(|_, _| (404, "404 page not found\n".into()));
        for e in [
            conn.get("ns", "x").await.unwrap_err(),
            conn.list(Some("ns")).await.unwrap_err(),
            conn.list(None).await.unwrap_err(),
        ] {
            assert!(matches!(e, PluginError::CrdMissing), "{e:?}");
        }
    }

    #[tokio::test]
    async fn forbidden_names_the_verb_and_scope() {
        let conn = fake(|_, _| (403, status_body(403, "Forbidden")));
        let e = conn.list(None).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "forbidden: you may not list singletonjobs.singleton.dev in all namespaces: Forbidden by the fake"
        );
        let e = conn.get("ns", "x").await.unwrap_err();
        assert!(
            e.to_string().starts_with(
                "forbidden: you may not get singletonjobs.singleton.dev in namespace ns"
            ),
            "{e}"
        );
        // Reading is allowed, patching is not.
        let conn = fake(|m, _| match *m {
            http::Method::PATCH => (403, status_body(403, "Forbidden")),
            _ => (
                200,
                serde_json::json!({"apiVersion": "singleton.dev/v1alpha1", "kind": "SingletonJob",
                    "metadata": {"name": "x", "namespace": "ns"},
                    "spec": {"schedule": "@daily", "jobTemplate": {}}})
                .to_string(),
            ),
        });
        let e = conn.set_suspend("ns", "x", true).await.unwrap_err();
        assert!(
            e.to_string().starts_with(
                "forbidden: you may not patch singletonjobs.singleton.dev in namespace ns"
            ),
            "{e}"
        );
        // Already in the wanted state: nothing is patched.
        let msg = conn.set_suspend("ns", "x", false).await.unwrap();
        assert_eq!(
            msg,
            "singletonjob ns/x already resumed (spec.suspend is false)\n"
        );
    }

    #[test]
    fn error_messages_say_what_to_do() {
        let e = PluginError::NotFound {
            namespace: "ns".into(),
            name: "x".into(),
        };
        assert_eq!(e.to_string(), "SingletonJob ns/x not found");
        assert_eq!(
            PluginError::CrdMissing.to_string(),
            "the SingletonJob CRD is not installed: kubectl apply -f crds/"
        );
        let e = PluginError::Forbidden {
            verb: "patch".into(),
            scope: " in namespace ns".into(),
            message: "no".into(),
        };
        assert_eq!(
            e.to_string(),
            "forbidden: you may not patch singletonjobs.singleton.dev in namespace ns: no"
        );
    }
}
