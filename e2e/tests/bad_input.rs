//! The bad-input battery: malformed and hostile SingletonJobs (and Secrets) applied while a good
//! one runs. Each is either refused by the API server (CRD schema or CEL) with a message, or
//! accepted and given a clear False condition with a message, and no Job. The controller never
//! exits or panics, never shows a Secret's password, and the good SingletonJob keeps its schedule.
//!
//! Adding a case is one line in `cases()`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use e2e::{Env, ensure, sj_yaml};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use singleton::api::SingletonJob;

/// The password in the credentials case: it must never appear in status, Events or the log.
const PASSWORD: &str = "Hunter2-e2e-S3cret-pw";

/// What must become of a case.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// `create` fails (422/400) and the message contains this text.
    Refused(&'static str),
    /// Accepted; the condition of this type becomes False with a message containing the text.
    False(&'static str, &'static str),
    /// Accepted and valid: it runs (at least one Job); `ttlSecondsAfterFinished` is stripped.
    Runs,
}
use Expect::*;

struct Case {
    /// Also the SingletonJob's name unless the YAML says otherwise.
    name: &'static str,
    yaml: String,
    expect: Expect,
}

fn c(name: &'static str, yaml: String, expect: Expect) -> Case {
    Case { name, yaml, expect }
}

/// A SingletonJob with this schedule and extra spec lines (two-space indented).
fn sj(name: &str, schedule: &str, extra: &str) -> String {
    sj_yaml(name, schedule, extra)
}

/// A valid every-2-seconds SingletonJob with extra spec lines.
fn ok(name: &str, extra: &str) -> String {
    sj(name, "*/2 * * * * *", extra)
}

/// A SingletonJob whose `spec.template.spec` (pod spec) is `pod` (indented 10 spaces).
fn pod(name: &str, pod: &str) -> String {
    format!(
        "apiVersion: singleton.dev/v1alpha1
kind: SingletonJob
metadata:
  name: {name}
spec:
  schedule: \"*/2 * * * * *\"
  jobTemplate:
    spec:
      template:
        spec:
{pod}"
    )
}

/// A SingletonJob with this `jobTemplate` (indented 4 spaces), or none.
fn template(name: &str, tpl: &str) -> String {
    format!(
        "apiVersion: singleton.dev/v1alpha1
kind: SingletonJob
metadata:
  name: {name}
spec:
  schedule: \"*/2 * * * * *\"
{tpl}"
    )
}

fn backstop(name: &str, secret: &str, extra: &str) -> String {
    ok(
        name,
        &format!("  backstop:\n    postgres:\n      secretRef: {{name: \"{secret}\"}}\n{extra}"),
    )
}

const CONTAINER: &str = "          restartPolicy: Never
          containers:
          - name: work
            image: busybox
";

// One line per case: rustfmt would spread each over several.
#[rustfmt::skip]
fn cases() -> Vec<Case> {
    let long = "x".repeat(300);
    vec![
        // Schedules.
        c("cron-7-fields", sj("cron-7-fields", "* * * * * * *", ""), Refused("schedule must have 5 fields")),
        c("cron-4-fields", sj("cron-4-fields", "* * * *", ""), Refused("schedule must have 5 fields")),
        c("cron-1-field", sj("cron-1-field", "hourly", ""), Refused("schedule must have 5 fields")),
        c("cron-empty", sj("cron-empty", "", ""), Refused("spec.schedule")),
        c("cron-blank", sj("cron-blank", "     ", ""), Refused("schedule must have 5 fields")),
        c("cron-300-chars", sj("cron-300-chars", &format!("{long} * * * *"), ""), Refused("spec.schedule")),
        c("cron-minute-61", sj("cron-minute-61", "61 * * * *", ""), False("ScheduleValid", "")),
        c("cron-hour-24", sj("cron-hour-24", "0 24 * * *", ""), False("ScheduleValid", "")),
        c("cron-dom-32", sj("cron-dom-32", "0 0 32 * *", ""), False("ScheduleValid", "")),
        c("cron-month-13", sj("cron-month-13", "0 0 1 13 *", ""), False("ScheduleValid", "")),
        c("cron-dow-8", sj("cron-dow-8", "0 0 * * 8", ""), False("ScheduleValid", "")),
        c("cron-second-60", sj("cron-second-60", "60 * * * * *", ""), False("ScheduleValid", "")),
        c("cron-feb-30", sj("cron-feb-30", "0 0 30 2 *", ""), False("ScheduleValid", "")),
        c("cron-reboot", sj("cron-reboot", "@reboot", ""), False("ScheduleValid", "")),
        c("cron-every-0s", sj("cron-every-0s", "@every 0s", ""), False("ScheduleValid", "from 1s")),
        c("cron-at", sj("cron-at", "@", ""), False("ScheduleValid", "")),
        c("cron-garbage", sj("cron-garbage", "hello world how are you", ""), False("ScheduleValid", "")),
        c("cron-unicode", sj("cron-unicode", "★ * * * *", ""), False("ScheduleValid", "")),
        c("cron-negative", sj("cron-negative", "-1 * * * *", ""), False("ScheduleValid", "")),
        c("cron-step-0", sj("cron-step-0", "*/0 * * * *", ""), False("ScheduleValid", "")),
        c("cron-reversed-range", sj("cron-reversed-range", "0 11-2 * * *", ""), False("ScheduleValid", "reversed")),
        c("cron-empty-list", sj("cron-empty-list", "0 0 , * *", ""), False("ScheduleValid", "lists no value")),
        c("cron-bare-l-weekday", sj("cron-bare-l-weekday", "0 0 * * L", ""), False("ScheduleValid", "needs a weekday")),
        c("cron-huge-number", sj("cron-huge-number", "99999999999999999999 * * * *", ""), False("ScheduleValid", "")),
        // Time zones.
        c("tz-unknown", ok("tz-unknown", "  timeZone: Mars/Olympus_Mons\n"), False("ScheduleValid", "")),
        c("tz-offset", ok("tz-offset", "  timeZone: UTC+25\n"), False("ScheduleValid", "")),
        c("tz-shell", ok("tz-shell", "  timeZone: \"Europe/Berlin; rm -rf /\"\n"), Refused("timeZone must be an IANA name")),
        c("tz-path", ok("tz-path", "  timeZone: ../../etc/passwd\n"), Refused("timeZone must be an IANA name")),
        c("tz-empty", ok("tz-empty", "  timeZone: \"\"\n"), Refused("timeZone")),
        c("tz-long", ok("tz-long", &format!("  timeZone: {}\n", "A".repeat(100))), Refused("timeZone")),
        // Numbers.
        c("deadline-negative", ok("deadline-negative", "  startingDeadlineSeconds: -1\n"), Refused("startingDeadlineSeconds")),
        c("deadline-zero", ok("deadline-zero", "  startingDeadlineSeconds: 0\n"), Refused("startingDeadlineSeconds")),
        c("deadline-huge", ok("deadline-huge", "  startingDeadlineSeconds: 1000000000000\n"), Refused("startingDeadlineSeconds")),
        c("deadline-string", ok("deadline-string", "  startingDeadlineSeconds: soon\n"), Refused("startingDeadlineSeconds")),
        c("history-negative", ok("history-negative", "  successfulJobsHistoryLimit: -5\n"), Refused("successfulJobsHistoryLimit")),
        c("history-huge", ok("history-huge", "  failedJobsHistoryLimit: 1000000\n"), Refused("failedJobsHistoryLimit")),
        // Names.
        // Events about an object are named after it plus 17 characters (at most 253 in all).
        c("name-230", ok(&"n".repeat(230), ""), Runs),
        c("name-231", ok(&"n".repeat(231), ""), Refused("230")),
        c("name-253", ok(&"n".repeat(253), ""), Refused("230")),
        c("name-254", ok(&"n".repeat(254), ""), Refused("")),
        c("name-unicode", ok("jöb-ünïcode", ""), Refused("")),
        c("name-emoji", ok("job-💥", ""), Refused("")),
        c("name-upper", ok("Invoices", ""), Refused("")),
        // Enums and types.
        c("catchup-sometimes", ok("catchup-sometimes", "  catchUp: Sometimes\n"), Refused("catchUp")),
        c("policy-lower", ok("policy-lower", "  concurrencyPolicy: forbid\n"), Refused("concurrencyPolicy")),
        c("purpose-unknown", ok("purpose-unknown", "  lock: {purpose: Maybe}\n"), Refused("purpose")),
        c("suspend-string", ok("suspend-string", "  suspend: \"yes please\"\n"), Refused("suspend")),
        c("dst-unknown", ok("dst-unknown", "  dstPolicy: {gap: Whenever}\n"), Refused("gap")),
        // Job templates.
        c("template-missing", template("template-missing", ""), Refused("jobTemplate")),
        c("template-string", template("template-string", "  jobTemplate: run my job\n"), Refused("jobTemplate")),
        c("template-no-spec", template("template-no-spec", "  jobTemplate: {metadata: {labels: {a: b}}}\n"), False("JobTemplateValid", "")),
        c("template-restart-always", pod("template-restart-always", "          restartPolicy: Always\n          containers:\n          - {name: work, image: busybox}\n"), False("JobTemplateValid", "restartPolicy")),
        c("template-no-containers", pod("template-no-containers", "          restartPolicy: Never\n          containers: []\n"), False("JobTemplateValid", "containers")),
        c("template-pull-policy", pod("template-pull-policy", &format!("{CONTAINER}            imagePullPolicy: Sometimes\n")), False("JobTemplateValid", "imagePullPolicy")),
        c("template-bad-container-name", pod("template-bad-container-name", "          restartPolicy: Never\n          containers:\n          - {name: Bad_Name, image: busybox}\n"), False("JobTemplateValid", "")),
        // Stored by the API server (the template keeps unknown fields); the controller decodes
        // the template only when building a Job, so this object stays readable and is reported.
        c("template-wrong-type", pod("template-wrong-type", &format!("{CONTAINER}          activeDeadlineSeconds: soon\n")), False("JobTemplateValid", "")),
        c("template-negative-backoff", template("template-negative-backoff", &format!("  jobTemplate:\n    spec:\n      backoffLimit: -3\n      template:\n        spec:\n{CONTAINER}")), False("JobTemplateValid", "backoffLimit")),
        c("template-ttl", template("template-ttl", &format!("  jobTemplate:\n    spec:\n      ttlSecondsAfterFinished: 0\n      template:\n        spec:\n{CONTAINER}")), Runs),
        // Several schedules, excluded days, jitter, deadlines, failures (issue 21).
        c("schedules-and-schedule", ok("schedules-and-schedule", "  schedules: [\"0 * * * *\"]\n"), Refused("set exactly one of schedule and schedules")),
        c("schedules-empty", sj("schedules-empty", "", "  schedules: []\n").replace("  schedule: \"\"\n", ""), Refused("spec.schedules")),
        c("schedules-21", sj("schedules-21", "", &format!("  schedules: [{}]\n", vec!["\"* * * * *\""; 21].join(", "))).replace("  schedule: \"\"\n", ""), Refused("spec.schedules")),
        c("schedules-4-fields", sj("schedules-4-fields", "", "  schedules: [\"0 * * * *\", \"* * * *\"]\n").replace("  schedule: \"\"\n", ""), Refused("each of schedules must have 5 fields")),
        c("schedules-one-invalid", sj("schedules-one-invalid", "", "  schedules: [\"*/2 * * * * *\", \"0 0 30 2 *\"]\n").replace("  schedule: \"\"\n", ""), False("ScheduleValid", "never fires")),
        c("exclusion-bad-date", ok("exclusion-bad-date", "  exclusions:\n    dates: [\"2027-02-30\"]\n"), False("ScheduleValid", "invalid date")),
        c("exclusion-reversed-range", ok("exclusion-reversed-range", "  exclusions:\n    ranges: [{from: \"2027-05-02\", to: \"2027-05-01\"}]\n"), False("ScheduleValid", "ends before it starts")),
        c("exclusion-day-rule-fields", ok("exclusion-day-rule-fields", "  exclusions:\n    days: [\"0 0 * * SAT\"]\n"), False("ScheduleValid", "expected 3 fields")),
        c("exclusion-missing-calendar", ok("exclusion-missing-calendar", "  exclusions:\n    calendars: [no-such-calendar]\n"), False("ScheduleValid", "no-such-calendar")),
        c("exclusion-bad-action", ok("exclusion-bad-action", "  exclusions:\n    action: Tomorrow\n"), Refused("action")),
        c("exclusion-date-long", ok("exclusion-date-long", &format!("  exclusions:\n    dates: [\"{long}\"]\n")), Refused("dates")),
        c("jitter-negative", ok("jitter-negative", "  jitterSeconds: -1\n"), Refused("jitterSeconds")),
        c("jitter-over-a-day", ok("jitter-over-a-day", "  jitterSeconds: 86401\n"), Refused("jitterSeconds")),
        c("completion-deadline-zero", ok("completion-deadline-zero", "  completionDeadlineSeconds: 0\n"), Refused("completionDeadlineSeconds")),
        c("completion-policy-unknown", ok("completion-policy-unknown", "  completionDeadlinePolicy: Kill\n"), Refused("completionDeadlinePolicy")),
        c("failures-zero", ok("failures-zero", "  suspendAfterConsecutiveFailures: 0\n"), Refused("suspendAfterConsecutiveFailures")),
        // Backstops.
        c("backstop-missing-secret", backstop("backstop-missing-secret", "no-such-secret", ""), False("BackstopReady", "not found")),
        c("backstop-unlabelled", backstop("backstop-unlabelled", "bad-unlabelled", ""), False("BackstopReady", "label")),
        c("backstop-nowhere", backstop("backstop-nowhere", "bad-nowhere", ""), False("BackstopReady", "")),
        c("backstop-credentials", backstop("backstop-credentials", "bad-credentials", ""), False("BackstopReady", "")),
        c("backstop-sslmode", backstop("backstop-sslmode", "bad-sslmode", ""), False("BackstopReady", "sslmode")),
        c("backstop-garbage-url", backstop("backstop-garbage-url", "bad-garbage-url", ""), False("BackstopReady", "")),
        c("backstop-empty-secret", backstop("backstop-empty-secret", "bad-empty", ""), False("BackstopReady", "")),
        c("backstop-bad-port", backstop("backstop-bad-port", "bad-port", ""), False("BackstopReady", "port")),
        c("backstop-prefix-injection", backstop("backstop-prefix-injection", "bad-nowhere", "      tablePrefix: \"Robert'); DROP TABLE students;--\"\n"), Refused("tablePrefix")),
        c("backstop-prefix-upper", backstop("backstop-prefix-upper", "bad-nowhere", "      tablePrefix: Claims_\n"), Refused("tablePrefix")),
        c("backstop-prefix-long", backstop("backstop-prefix-long", "bad-nowhere", &format!("      tablePrefix: {}\n", "p".repeat(40))), Refused("tablePrefix")),
        c("backstop-secret-empty-name", backstop("backstop-secret-empty-name", "", ""), Refused("secretRef")),
        c("backstop-secret-long-name", backstop("backstop-secret-long-name", &long, ""), Refused("secretRef")),
        // A backstop that names no database must not silently run without one.
        c("backstop-no-kind", ok("backstop-no-kind", "  backstop: {}\n"), Refused("backstop")),
        // Noisy neighbours (issue 19): a server that accepts and never answers is reported within
        // the operation timeout; a host outside --backstop-allowed-hosts is refused untried.
        c("backstop-blackholed", backstop("backstop-blackholed", "bad-blackhole", ""), False("BackstopReady", "timed out")),
        c("backstop-host-not-allowed", backstop("backstop-host-not-allowed", "bad-not-allowed", ""), False("BackstopReady", "not in the controller's allowed backstop hosts")),
        c("backstop-name-not-allowed", backstop("backstop-name-not-allowed", "bad-name-not-allowed", ""), False("BackstopReady", "not in the controller's allowed backstop hosts")),
    ]
}

/// A Secret: name, labelled for the backstop, string data.
type SecretSpec = (&'static str, bool, Vec<(&'static str, String)>);

/// The Secrets the backstop cases refer to (labelled unless said otherwise).
async fn secrets(env: &Env) -> Result<()> {
    let items: [SecretSpec; 7] = [
        (
            "bad-unlabelled",
            false,
            vec![("url", "postgres://u@127.0.0.1:1/db".into())],
        ),
        (
            "bad-nowhere",
            true,
            vec![("url", "postgres://u@127.0.0.1:1/db".into())],
        ),
        (
            "bad-credentials",
            true,
            vec![(
                "url",
                format!("postgres://admin:{PASSWORD}@127.0.0.1:1/db?sslmode=disable"),
            )],
        ),
        (
            "bad-sslmode",
            true,
            vec![
                ("url", "postgres://u@127.0.0.1:1/db".into()),
                ("sslmode", "sometimes".into()),
            ],
        ),
        (
            "bad-garbage-url",
            true,
            vec![("url", "¡not a url at all!".into())],
        ),
        ("bad-empty", true, vec![]),
        (
            "bad-port",
            true,
            vec![
                ("host", "127.0.0.1".into()),
                ("port", "99999".into()),
                ("user", "u".into()),
            ],
        ),
    ];
    let api: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns);
    for (name, labelled, data) in items {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        if labelled {
            s.metadata.labels =
                Some([("singleton.dev/backstop".to_string(), "true".to_string())].into());
        }
        s.string_data = Some(data.into_iter().map(|(k, v)| (k.into(), v)).collect());
        api.create(&PostParams::default(), &s).await?;
    }
    Ok(())
}

/// The Secrets of the noisy-neighbour cases: a black hole (a listener that accepts and never
/// answers, owned by the returned proxy) and hosts outside the battery's allow-list.
async fn noisy_secrets(env: &Env) -> Result<e2e::Proxy> {
    let hole = e2e::Proxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], 1))).await?;
    hole.stall();
    let api: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns);
    for (name, url) in [
        (
            "bad-blackhole",
            format!("postgres://u@127.0.0.1:{}/db?sslmode=disable", hole.port),
        ),
        (
            "bad-not-allowed",
            "postgres://u@10.1.2.3:5432/db".to_string(),
        ),
        (
            "bad-name-not-allowed",
            "postgres://u@db.example.invalid:5432/db".to_string(),
        ),
    ] {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.labels =
            Some([("singleton.dev/backstop".to_string(), "true".to_string())].into());
        s.string_data = Some([("url".to_string(), url)].into());
        api.create(&PostParams::default(), &s).await?;
    }
    Ok(hole)
}

/// Creates a SingletonJob from raw YAML (no client-side typing, so the API server judges it).
async fn create_raw(env: &Env, yaml: &str) -> Result<std::result::Result<String, String>> {
    let ar = ApiResource::erase::<SingletonJob>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &ar);
    let value: serde_json::Value = serde_yaml::from_str(yaml).context("case YAML")?;
    let obj: DynamicObject = serde_json::from_value(value)?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(o) => Ok(Ok(o.name_any())),
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 => Ok(Err(s.message)),
        Err(e) => Err(e.into()),
    }
}

/// The object as the API server has it, untyped (a typed read would fail on a template the
/// Rust types cannot hold, which is one of the cases).
async fn get_raw(env: &Env, name: &str) -> Result<serde_json::Value> {
    let ar = ApiResource::erase::<SingletonJob>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &ar);
    Ok(serde_json::to_value(api.get(name).await?)?)
}

fn uid(obj: &serde_json::Value) -> String {
    obj["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// (type, status, reason, message) of each condition.
fn conditions(obj: &serde_json::Value) -> Vec<[String; 4]> {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    obj["status"]["conditions"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    [
                        text(&c["type"]),
                        text(&c["status"]),
                        text(&c["reason"]),
                        text(&c["message"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default()
}

fn owned_by(jobs: &[Job], uid: &str) -> Vec<Job> {
    jobs.iter()
        .filter(|j| j.owner_references().iter().any(|o| o.uid == uid))
        .cloned()
        .collect()
}

#[tokio::test]
async fn bad_input_battery() -> Result<()> {
    let started = Instant::now();
    let mut env = Env::new("bad-input").await?;
    // The battery's backstops are all on loopback; anything else is outside the allow-list.
    env.start_controller(&["--backstop-allowed-hosts", "127.0.0.0/8,::1"])
        .await?;
    secrets(&env).await?;
    let _hole = noisy_secrets(&env).await?;
    // The good one: Allow, so it never waits on a run, and history kept, so every Job is counted.
    env.create_sj(&ok(
        "good",
        "  concurrencyPolicy: Allow\n  successfulJobsHistoryLimit: 100\n  failedJobsHistoryLimit: 100\n",
    ))
    .await?;
    env.wait_for(
        "the good SingletonJob's first Job",
        Duration::from_secs(20),
        || async { Ok((!env.job_list().await?.is_empty()).then_some(())) },
    )
    .await?;
    let battery_start = Instant::now();

    // Apply every case; refusals are judged at once.
    let cases = cases();
    let mut failures = Vec::new();
    let mut accepted = Vec::new(); // (case, object name)
    let names: BTreeSet<&str> = cases.iter().map(|c| c.name).collect();
    ensure(&env, names.len() == cases.len(), "case names are unique").await?;
    for case in &cases {
        match (create_raw(&env, &case.yaml).await?, case.expect) {
            (Err(msg), Refused(want)) => {
                if msg.is_empty() || !msg.contains(want) {
                    failures.push(format!(
                        "{}: refused, but message {msg:?} lacks {want:?}",
                        case.name
                    ));
                }
            }
            (Err(msg), _) => failures.push(format!(
                "{}: refused ({msg}), expected {:?}",
                case.name, case.expect
            )),
            (Ok(obj), Refused(_)) => {
                failures.push(format!(
                    "{}: accepted, expected {:?}",
                    case.name, case.expect
                ));
                accepted.push((case, obj));
            }
            (Ok(obj), _) => accepted.push((case, obj)),
        }
    }

    // Accepted ones: their condition within a deadline.
    let deadline = Instant::now() + Duration::from_secs(25);
    let mut pending: Vec<_> = accepted
        .iter()
        .filter(|(c, _)| matches!(c.expect, False(..) | Runs))
        .collect();
    while !pending.is_empty() && Instant::now() < deadline {
        let mut still = Vec::new();
        let jobs = env.job_list().await?;
        for item in pending {
            let (case, obj) = item;
            let sj = get_raw(&env, obj).await?;
            let done = match case.expect {
                False(ty, want) => conditions(&sj).iter().any(|[t, st, _, msg]| {
                    t == ty && st == "False" && !msg.is_empty() && msg.contains(want)
                }),
                Runs => !owned_by(&jobs, &uid(&sj)).is_empty(),
                Refused(_) => true,
            };
            if !done {
                still.push(item);
            }
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for (case, obj) in pending {
        let conds = conditions(&get_raw(&env, obj).await?);
        failures.push(format!(
            "{}: expected {:?} within the deadline; conditions {conds:?}",
            case.name, case.expect
        ));
    }

    // Let several periods pass over every bad one (and the good one), then count.
    env.wait_for("10 s of battery", Duration::from_secs(30), || async {
        Ok((battery_start.elapsed() >= Duration::from_secs(10)).then_some(()))
    })
    .await?;
    let jobs = env.job_list().await?;
    for (case, obj) in &accepted {
        let mine = owned_by(&jobs, &uid(&get_raw(&env, obj).await?));
        match case.expect {
            Runs => {
                for j in &mine {
                    let ttl = j.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished);
                    if ttl.is_some() {
                        failures.push(format!(
                            "{}: Job {} kept ttlSecondsAfterFinished {ttl:?}",
                            case.name,
                            j.name_any()
                        ));
                    }
                }
            }
            _ if !mine.is_empty() => failures.push(format!(
                "{}: {} Job(s) created for a bad spec: {:?}",
                case.name,
                mine.len(),
                mine.iter().map(|j| j.name_any()).collect::<Vec<_>>()
            )),
            _ => {}
        }
    }

    // The good one kept its schedule: a Job per period, one each.
    let good = env.get_sj("good").await?;
    let good_jobs = owned_by(&jobs, &good.uid().unwrap_or_default());
    let periods: Vec<String> = good_jobs
        .iter()
        .filter_map(|j| j.annotations().get("singleton.dev/period").cloned())
        .collect();
    let distinct: BTreeSet<&String> = periods.iter().collect();
    let elapsed = battery_start.elapsed().as_secs();
    // A period every 2 s since the battery began, less two for edges.
    let want = (elapsed / 2).saturating_sub(2) as usize;
    if distinct.len() != periods.len() {
        failures.push(format!("good: two Jobs for one period: {periods:?}"));
    }
    if periods.len() < want.max(4) {
        failures.push(format!(
            "good: {} runs in {elapsed} s of battery, expected at least {}",
            periods.len(),
            want.max(4)
        ));
    }

    // The password appears nowhere.
    let ar = ApiResource::erase::<SingletonJob>(&());
    let all: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &ar);
    let status_text = serde_json::to_string(&all.list(&ListParams::default()).await?.items)?;
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    let event_text: String = events
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|e| {
            format!(
                "{} {}\n",
                e.reason.clone().unwrap_or_default(),
                e.message.clone().unwrap_or_default()
            )
        })
        .collect();
    let log = env.controller_log(0);
    for (what, text) in [
        ("status", &status_text),
        ("events", &event_text),
        ("controller log", &log),
    ] {
        if text.contains(PASSWORD) {
            failures.push(format!("the Secret's password appears in the {what}"));
        }
    }

    // The controller is alive and never panicked.
    if let Some(exit) = env.controller_exit(0)? {
        failures.push(format!("the controller exited: {exit}"));
    }
    if log.contains("panicked") {
        failures.push("the controller log shows a panic".into());
    }

    eprintln!(
        "bad-input battery: {} cases ({} refused at apply time, {} accepted), good ran {} times, {:.1?} in all",
        cases.len(),
        cases.len() - accepted.len(),
        accepted.len(),
        periods.len(),
        started.elapsed()
    );
    if !failures.is_empty() {
        bail!(
            "{} failure(s):\n  {}\n{}",
            failures.len(),
            failures.join("\n  "),
            env.dump().await
        );
    }
    Ok(())
}
