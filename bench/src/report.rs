//! results.md: both controllers side by side, their ratio, and the target per row.
use serde_json::Value;

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn fmt_ms(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(x) if x >= 10_000.0 => format!("{:.1} s", x / 1000.0),
        Some(x) if x >= 100.0 => format!("{x:.0} ms"),
        Some(x) => format!("{x:.1} ms"),
    }
}

fn fmt_mib(v: Option<f64>) -> String {
    v.map_or("–".into(), |k| format!("{:.1} MiB", k / 1024.0))
}

fn fmt_n(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |x| format!("{x:.digits$}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "–".into(),
    }
}

struct Table(Vec<[String; 5]>);

impl Table {
    fn row(&mut self, what: &str, sj: String, cj: String, r: String, target: &str) {
        self.0.push([what.into(), sj, cj, r, target.into()]);
    }

    /// A row of milliseconds with the SingletonJob/CronJob ratio.
    fn ms(&mut self, what: &str, sj: Option<f64>, cj: Option<f64>, target: &str) {
        self.row(what, fmt_ms(sj), fmt_ms(cj), ratio(sj, cj), target);
    }
}

/// The number at `path` in the results, if there is one.
fn p(r: &Value, path: &str) -> Option<f64> {
    num(r.pointer(path).unwrap_or(&Value::Null))
}

/// The count at `path` in the results, 0 if there is none.
fn n(r: &Value, path: &str) -> u64 {
    r.pointer(path).and_then(Value::as_u64).unwrap_or(0)
}

pub fn markdown(r: &Value) -> String {
    let mut t = Table(Vec::new());
    skew_rows(&mut t, r);
    let (rate, floor) = throughput_rows(&mut t, r);
    for (size, k) in &bursts(r) {
        let b = Burst {
            r,
            size: *size,
            key: k,
        };
        burst_skew_rows(&mut t, &b);
        burst_bound_rows(&mut t, &b, rate, floor);
        burst_cost_rows(&mut t, &b);
    }
    failover_rows(&mut t, r);
    footprint_rows(&mut t, r);
    idle_request_rows(&mut t, r);
    page(r, t)
}

/// The skew of the idle workload (both sides) and of the every-second schedule.
fn skew_rows(t: &mut Table, r: &Value) {
    for q in ["p50", "p99", "max"] {
        let target = if q == "p99" {
            "SingletonJob ≤ ½ CronJob"
        } else {
            ""
        };
        t.ms(
            &format!(
                "idle, one run each 2 min: skew {q} (n = {} / {})",
                n(r, "/idle/SingletonJob/skew/n"),
                n(r, "/idle/CronJob/skew/n")
            ),
            p(r, &format!("/idle/SingletonJob/skew/{q}_ms")),
            p(r, &format!("/idle/CronJob/skew/{q}_ms")),
            target,
        );
    }
    for q in ["p50", "p99", "max"] {
        t.row(
            &format!(
                "every second (SingletonJob only): skew {q} (n = {})",
                n(r, "/seconds/skew/n")
            ),
            fmt_ms(p(r, &format!("/seconds/skew/{q}_ms"))),
            "no seconds field".into(),
            "–".into(),
            "",
        );
    }
}

/// The API server's raw throughputs; returns them (Jobs/s, claims + creates/s) for the bursts'
/// bounds.
fn throughput_rows(t: &mut Table, r: &Value) -> (Option<f64>, Option<f64>) {
    let rate = p(r, "/raw/jobs_per_second");
    t.row(
        "API server's raw Job-create throughput (64 in flight)",
        fmt_n(rate, 0) + " Jobs/s",
        "(same)".into(),
        "–".into(),
        "",
    );
    let floor = p(r, "/raw/claim_create_per_second");
    t.row(
        "API server's raw claim + create throughput (a status write, then a create; 64 in flight)",
        fmt_n(floor, 0) + " runs/s",
        "(same)".into(),
        "–".into(),
        "",
    );
    (rate, floor)
}

/// The bursts in the results, (size, key), smallest first.
fn bursts(r: &Value) -> Vec<(u64, String)> {
    let bursts: Vec<String> = r
        .as_object()
        .map(|o| {
            o.keys()
                .filter(|k| k.starts_with("burst"))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let mut bursts: Vec<(u64, String)> = bursts
        .into_iter()
        .filter_map(|k| k.trim_start_matches("burst").parse().ok().map(|n| (n, k)))
        .collect();
    bursts.sort();
    bursts
}

/// One burst's results: its size and its key (`burst<size>`).
struct Burst<'a> {
    r: &'a Value,
    size: u64,
    key: &'a str,
}

impl Burst<'_> {
    /// The number `f` of `kind`'s side of the burst.
    fn b(&self, kind: &str, f: &str) -> Option<f64> {
        p(self.r, &format!("/{}/{kind}/{f}", self.key))
    }
}

/// A burst's skew quantiles and when its last Job existed.
fn burst_skew_rows(t: &mut Table, b: &Burst) {
    let (size, k) = (b.size, b.key);
    let created = format!(
        "{} / {}",
        n(b.r, &format!("/{k}/SingletonJob/jobs_created")),
        n(b.r, &format!("/{k}/CronJob/jobs_created"))
    );
    for q in ["p50", "p99", "max"] {
        t.ms(
            &format!("burst {size}: skew {q} (Jobs: {created})"),
            b.b("SingletonJob", &format!("skew/{q}_ms")),
            b.b("CronJob", &format!("skew/{q}_ms")),
            if q == "p99" {
                "SingletonJob ≤ CronJob"
            } else {
                ""
            },
        );
    }
    t.ms(
        &format!("burst {size}: last Job exists after"),
        b.b("SingletonJob", "last_ms"),
        b.b("CronJob", "last_ms"),
        "",
    );
}

/// A burst against what the API server's raw throughputs (`rate`, `floor`) allow, where measured.
fn burst_bound_rows(t: &mut Table, b: &Burst, rate: Option<f64>, floor: Option<f64>) {
    let size = b.size;
    if let Some(rate) = rate {
        let bound_p99 = 0.99 * size as f64 / rate * 1000.0;
        let bound_last = size as f64 / rate * 1000.0;
        t.row(
            &format!("burst {size}: raw-throughput bound, p99 / last"),
            format!("{} / {}", fmt_ms(Some(bound_p99)), fmt_ms(Some(bound_last))),
            "(same)".into(),
            "–".into(),
            "",
        );
        t.row(
            &format!("burst {size}: p99 skew ÷ raw bound"),
            fmt_n(b.b("SingletonJob", "skew/p99_ms").map(|x| x / bound_p99), 2) + "×",
            fmt_n(b.b("CronJob", "skew/p99_ms").map(|x| x / bound_p99), 2) + "×",
            "–".into(),
            "SingletonJob ≤ 1.5×",
        );
    }
    if let Some(floor) = floor {
        let bound_p99 = 0.99 * size as f64 / floor * 1000.0;
        t.row(
            &format!("burst {size}: claim + create bound, p99 / last"),
            format!(
                "{} / {}",
                fmt_ms(Some(bound_p99)),
                fmt_ms(Some(size as f64 / floor * 1000.0))
            ),
            "–".into(),
            "–".into(),
            "",
        );
        t.row(
            &format!("burst {size}: p99 skew ÷ claim + create bound"),
            fmt_n(b.b("SingletonJob", "skew/p99_ms").map(|x| x / bound_p99), 2) + "×",
            "–".into(),
            "–".into(),
            "",
        );
    }
}

/// What a burst cost: API requests per run, resident memory and CPU.
fn burst_cost_rows(t: &mut Table, b: &Burst) {
    let size = b.size;
    t.row(
        &format!("burst {size}: API requests per run, to start it (until last Job + 2 s)"),
        fmt_n(b.b("SingletonJob", "requests_per_run"), 2),
        fmt_n(b.b("CronJob", "requests_per_run"), 2),
        ratio(
            b.b("SingletonJob", "requests_per_run"),
            b.b("CronJob", "requests_per_run"),
        ),
        "",
    );
    t.row(
        &format!("burst {size}: resident memory idle → peak (KCM for CronJob)"),
        format!(
            "{} → {}",
            fmt_mib(b.b("SingletonJob", "rss_idle_kib")),
            fmt_mib(b.b("SingletonJob", "rss_peak_kib"))
        ),
        format!(
            "{} → {}",
            fmt_mib(b.b("CronJob", "rss_idle_kib")),
            fmt_mib(b.b("CronJob", "rss_peak_kib"))
        ),
        ratio(
            b.b("SingletonJob", "rss_peak_kib"),
            b.b("CronJob", "rss_peak_kib"),
        ),
        if size == 1000 {
            "SingletonJob < 30 MiB"
        } else {
            ""
        },
    );
    t.row(
        &format!("burst {size}: CPU seconds, due − 2 s → last Job + 2 s"),
        fmt_n(b.b("SingletonJob", "cpu_seconds"), 2),
        fmt_n(b.b("CronJob", "cpu_seconds"), 2),
        ratio(
            b.b("SingletonJob", "cpu_seconds"),
            b.b("CronJob", "cpu_seconds"),
        ),
        "",
    );
}

/// The failover rounds (SingletonJob only: the KCM here runs no leader election).
fn failover_rows(t: &mut Table, r: &Value) {
    let fo = |sig: &str, what: &str| -> String {
        r.pointer(&format!("/failover/{sig}/{what}"))
            .and_then(Value::as_array)
            .map(|v| {
                v.iter()
                    .map(|x| x.as_f64().map_or("none".into(), |s| format!("{s:.2} s")))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_else(|| "–".into())
    };
    t.row(
        "failover, 3 replicas, SIGKILL of the leader: signal → next run",
        fo("SIGKILL", "seconds_to_next_run"),
        "no leader election".into(),
        "–".into(),
        "≤ lease (15 s) + 2 s",
    );
    t.row(
        "failover, SIGTERM of the leader: signal → next run (every-second schedule)",
        fo("SIGTERM", "seconds_to_next_run"),
        "–".into(),
        "–".into(),
        "",
    );
    t.row(
        "failover, SIGTERM: first period after the signal started late by",
        fo("SIGTERM", "first_period_late_by_seconds"),
        "–".into(),
        "–".into(),
        "< 1 s",
    );
}

/// Many objects at rest: memory, API requests and CPU.
fn footprint_rows(t: &mut Table, r: &Value) {
    let fp = n(r, "/footprint/n");
    let f = |kind: &str, k: &str| p(r, &format!("/footprint/{kind}/{k}"));
    t.row(
        &format!("{fp} objects at rest: resident memory (KCM for CronJob)"),
        fmt_mib(f("SingletonJob", "rss_kib")),
        fmt_mib(f("CronJob", "rss_kib")),
        ratio(f("SingletonJob", "rss_kib"), f("CronJob", "rss_kib")),
        if fp >= 10_000 {
            "SingletonJob < 80 MiB"
        } else {
            ""
        },
    );
    t.row(
        &format!("{fp} objects at rest: API requests per minute"),
        fmt_n(f("SingletonJob", "requests_per_minute_at_rest"), 1),
        fmt_n(f("CronJob", "requests_per_minute_at_rest"), 1),
        ratio(
            f("SingletonJob", "requests_per_minute_at_rest"),
            f("CronJob", "requests_per_minute_at_rest"),
        ),
        "no polling",
    );
    t.row(
        &format!("{fp} objects at rest: CPU"),
        fmt_n(f("SingletonJob", "cpu_percent_at_rest"), 2) + " %",
        fmt_n(f("CronJob", "cpu_percent_at_rest"), 2) + " %",
        "–".into(),
        "",
    );
}

/// The idle workload's API requests, per run and per minute.
fn idle_request_rows(t: &mut Table, r: &Value) {
    t.row(
        "idle: API requests per run, start to completion (and at-rest traffic)",
        fmt_n(p(r, "/idle/SingletonJob/requests_per_run"), 1),
        fmt_n(p(r, "/idle/CronJob/requests_per_run"), 1),
        ratio(
            p(r, "/idle/SingletonJob/requests_per_run"),
            p(r, "/idle/CronJob/requests_per_run"),
        ),
        "",
    );
    t.row(
        "idle: API requests per minute (one run each 2 min)",
        fmt_n(p(r, "/idle/SingletonJob/requests_per_minute"), 1),
        fmt_n(p(r, "/idle/CronJob/requests_per_minute"), 1),
        ratio(
            p(r, "/idle/SingletonJob/requests_per_minute"),
            p(r, "/idle/CronJob/requests_per_minute"),
        ),
        "",
    );
}

/// The page: title, the run's mode, times and machine, what the measures mean, then the table.
fn page(r: &Value, t: Table) -> String {
    let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
    let mut md = String::new();
    md.push_str("# make bench: SingletonJob and CronJob side by side\n\n");
    md.push_str(&format!(
        "Mode `{}`, started {}, wall time {} min. Machine: {}.\n\n",
        s("mode"),
        s("started"),
        fmt_n(p(r, "/wall_seconds").map(|x| x / 60.0), 1),
        s("machine")
    ));
    md.push_str(
        "Skew = the instant the Job may run (audit log, µs: a SingletonJob's resume, a \
         CronJob's create) minus its scheduled instant. The CronJob \
         column is kube-controller-manager restricted to `--controllers=cronjob,job`, defaults \
         otherwise; its memory and CPU include the Job controller, which serves both sides. \
         Ratio = SingletonJob ÷ CronJob. Method and limits: docs/performance.md.\n\n",
    );
    md.push_str("| measure | SingletonJob | CronJob | ratio | target |\n");
    md.push_str("| --- | --- | --- | --- | --- |\n");
    for row in t.0 {
        md.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    md
}
