//! results.md: both controllers side by side (SingletonJob with and without prepared runs), their
//! ratio, and the target per row; then issue 33's acceptance ratios, and the lead-0 side
//! against the run committed before preparation ([`BASELINE`]).
use serde_json::Value;

use crate::stats;

mod acceptance;

/// results.json of the full run committed before prepared runs (2026-12-03 21:47 UTC): "with lead
/// time 0, no figure worse than today's" is judged against it.
const BASELINE: &str = include_str!("../baseline/results-2026-12-03.json");

const SJ: &str = "SingletonJob";
const SJ0: &str = "SingletonJob lead 0";
const CJ: &str = "CronJob";

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

fn fmt_pct(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{:.0} %", x * 100.0))
}

/// measure | SingletonJob | SingletonJob lead 0 | CronJob | ratio | target.
struct Table(Vec<[String; 6]>);

impl Table {
    /// A row without a lead-0 figure (the same controller, or not measured twice).
    fn row(&mut self, what: &str, sj: String, cj: String, r: String, target: &str) {
        self.row3(what, [sj, "–".into(), cj], r, target);
    }

    /// A row of a figure that holds for every column (the API server's).
    fn same(&mut self, what: &str, v: String) {
        self.row3(what, [v, "(same)".into(), "(same)".into()], "–".into(), "");
    }

    fn row3(&mut self, what: &str, [sj, sj0, cj]: [String; 3], r: String, target: &str) {
        self.0.push([what.into(), sj, sj0, cj, r, target.into()]);
    }

    /// A row of milliseconds with the SingletonJob/CronJob ratio.
    fn ms(&mut self, what: &str, [sj, sj0, cj]: [Option<f64>; 3], target: &str) {
        self.row3(
            what,
            [fmt_ms(sj), fmt_ms(sj0), fmt_ms(cj)],
            ratio(sj, cj),
            target,
        );
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
        burst_instant_rows(&mut t, &b);
        burst_cost_rows(&mut t, &b);
    }
    failover_rows(&mut t, r);
    footprint_rows(&mut t, r);
    idle_request_rows(&mut t, r);
    let baseline = serde_json::from_str(BASELINE).unwrap_or(Value::Null);
    let mut md = page(r, t);
    md.push_str(&acceptance::section(r, &baseline));
    md
}

/// The skew of the idle workload (both sides) and of the every-second schedule.
fn skew_rows(t: &mut Table, r: &Value) {
    for q in ["p50", "p99", "max"] {
        let target = if q == "p99" {
            "SingletonJob ≤ 0.1× CronJob"
        } else {
            ""
        };
        t.ms(
            &format!(
                "idle, one run each 2 min: skew {q} (n = {} / {} / {})",
                n(r, "/idle/SingletonJob/skew/n"),
                n(r, "/idle/SingletonJob lead 0/skew/n"),
                n(r, "/idle/CronJob/skew/n")
            ),
            [SJ, SJ0, CJ].map(|k| p(r, &format!("/idle/{k}/skew/{q}_ms"))),
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
/// bounds. Then the patch bound's throughput and round trip (a prepared run's one request).
fn throughput_rows(t: &mut Table, r: &Value) -> (Option<f64>, Option<f64>) {
    let rate = p(r, "/raw/jobs_per_second");
    t.same(
        "API server's raw Job-create throughput (64 in flight)",
        fmt_n(rate, 0) + " Jobs/s",
    );
    let floor = p(r, "/raw/claim_create_per_second");
    t.same(
        "API server's raw claim + create throughput (a status write, then a create; 64 in flight)",
        fmt_n(floor, 0) + " runs/s",
    );
    t.same(
        "API server's raw patch throughput P (a prepared run's resume, suspend kept; 64 in flight)",
        fmt_n(p(r, "/raw/patches_per_second"), 0) + " patches/s",
    );
    t.same(
        "a patch's round trip at rest, p50 / p99 (50 one after the other)",
        format!(
            "{} / {}",
            fmt_ms(p(r, "/raw/patch_round_trip/p50_ms")),
            fmt_ms(p(r, "/raw/patch_round_trip/p99_ms"))
        ),
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

    /// The number `f` of each side: SingletonJob, SingletonJob lead 0, CronJob.
    fn sides(&self, f: &str) -> [Option<f64>; 3] {
        [SJ, SJ0, CJ].map(|k| self.b(k, f))
    }

    /// Each side's cell by `cell` (given the side's key); "not run" for a side the burst lacks.
    fn cells(&self, cell: impl Fn(&str) -> String) -> [String; 3] {
        [SJ, SJ0, CJ].map(|k| {
            if self.b(k, "n").is_none() {
                "not run".into()
            } else {
                cell(k)
            }
        })
    }

    /// Each side's number `f` formatted by `fmt`.
    fn fmt(&self, f: &str, fmt: impl Fn(Option<f64>) -> String) -> [String; 3] {
        self.cells(|k| fmt(self.b(k, f)))
    }
}

/// A burst's skew quantiles and when its last Job existed.
fn burst_skew_rows(t: &mut Table, b: &Burst) {
    let (size, k) = (b.size, b.key);
    if b.b(CJ, "n").is_none() {
        t.row(
            &format!("burst {size}: CronJob"),
            "–".into(),
            format!(
                "not run: its client's 20 requests/s took {} for 1,000",
                fmt_ms(p(b.r, "/burst1000/CronJob/last_ms"))
            ),
            "–".into(),
            "",
        );
    }
    let created = [SJ, SJ0, CJ]
        .map(|s| n(b.r, &format!("/{k}/{s}/jobs_created")).to_string())
        .join(" / ");
    for q in ["p50", "p99", "max"] {
        t.ms(
            &format!("burst {size}: skew {q} (Jobs: {created})"),
            b.sides(&format!("skew/{q}_ms")),
            if q == "p99" {
                "SingletonJob ≤ CronJob"
            } else {
                ""
            },
        );
    }
    let runs = n(b.r, &format!("/{k}/SingletonJob/runs"));
    if runs > 1 {
        t.row3(
            &format!("burst {size}: skew p99 of {runs} runs, min – max (the row: the median run)"),
            [SJ, SJ0, CJ].map(|s| spread_cell(b.r, &format!("/{k}/{s}/p99_spread_ms"))),
            "–".into(),
            "",
        );
    }
    t.ms(
        &format!("burst {size}: first Job's skew"),
        b.sides("first_ms"),
        if size == 100 {
            "SingletonJob ≤ CronJob"
        } else {
            ""
        },
    );
    t.ms(
        &format!("burst {size}: last Job exists after"),
        b.sides("last_ms"),
        "",
    );
}

/// "min – max" of the pair at `path`.
fn spread_cell(r: &Value, path: &str) -> String {
    let v = |i: usize| p(r, &format!("{path}/{i}"));
    match (v(0), v(1)) {
        (None, None) => "–".into(),
        (lo, hi) => format!("{} – {}", fmt_ms(lo), fmt_ms(hi)),
    }
}

/// A burst against what the API server's raw throughputs (`rate`, `floor`) allow, where measured,
/// and against the patch bound P (one request per run: a prepared run's resume).
fn burst_bound_rows(t: &mut Table, b: &Burst, rate: Option<f64>, floor: Option<f64>) {
    let size = b.size;
    let p99 = b.sides("skew/p99_ms");
    let over = |bound: f64| p99.map(|x| fmt_n(x.map(|x| x / bound), 2) + "×");
    if let Some(bound_p99) = b.b(SJ, "patch_bound_ms").or(b.b(SJ0, "patch_bound_ms")) {
        t.same(
            &format!("burst {size}: patch bound 0.99·N/P, p99 / last"),
            format!(
                "{} / {}",
                fmt_ms(Some(bound_p99)),
                fmt_ms(Some(bound_p99 / 0.99))
            ),
        );
        t.row3(
            &format!("burst {size}: p99 skew ÷ patch bound"),
            over(bound_p99),
            "–".into(),
            &patch_target(size),
        );
    }
    if let Some(bound_p99) = rate.and_then(|rate| stats::bound_ms(size as usize, rate)) {
        t.same(
            &format!("burst {size}: raw-throughput (create) bound, p99 / last"),
            format!(
                "{} / {}",
                fmt_ms(Some(bound_p99)),
                fmt_ms(Some(bound_p99 / 0.99))
            ),
        );
        t.row3(
            &format!("burst {size}: p99 skew ÷ raw (create) bound"),
            over(bound_p99),
            "–".into(),
            "",
        );
    }
    if let Some(bound_p99) = floor.and_then(|floor| stats::bound_ms(size as usize, floor)) {
        let bound = format!(
            "{} / {}",
            fmt_ms(Some(bound_p99)),
            fmt_ms(Some(bound_p99 / 0.99))
        );
        t.row3(
            &format!("burst {size}: claim + create bound, p99 / last"),
            [bound, "(same)".into(), "–".into()],
            "–".into(),
            "",
        );
        let [sj, sj0, _] = over(bound_p99);
        t.row3(
            &format!("burst {size}: p99 skew ÷ claim + create bound"),
            [sj, sj0, "–".into()],
            "–".into(),
            "",
        );
    }
}

/// Issue 33's limit for a burst's p99 against its patch bound, for the sizes it names.
fn patch_limit(size: u64) -> Option<f64> {
    match size {
        1_000 => Some(1.5),
        100 | 10_000 => Some(2.0),
        _ => None,
    }
}

fn patch_target(size: u64) -> String {
    patch_limit(size).map_or(String::new(), |l| format!("SingletonJob ≤ {l}×"))
}

/// Where a burst's requests fall: before its instant (a prepared run's claim, create, confirm)
/// or after it, the starts (resumes; CronJob's creates) among those after, and the lead.
fn burst_instant_rows(t: &mut Table, b: &Burst) {
    let size = b.size;
    let lead = |k: &str| match b.b(k, "prepare_lead_seconds") {
        None => "not run".to_string(),
        Some(l) => format!("{l:.0} s ({})", fmt_n(b.b(k, "prepared_in_time"), 0)),
    };
    t.row3(
        &format!("burst {size}: prepare lead (runs prepared before the instant)"),
        [lead(SJ), lead(SJ0), "–".into()],
        "–".into(),
        "",
    );
    let before_after = |k: &str| {
        let f = |q: &str| fmt_n(b.b(k, q), 2);
        format!(
            "{} / {}",
            f("requests_per_run_before"),
            f("requests_per_run_after")
        )
    };
    t.row3(
        &format!("burst {size}: API requests per run before / after the instant"),
        b.cells(before_after),
        "–".into(),
        "",
    );
    t.row3(
        &format!("burst {size}: share of the requests done before the instant"),
        b.fmt("share_before", fmt_pct),
        "–".into(),
        "",
    );
    t.row3(
        &format!(
            "burst {size}: after the instant, the starts' share (resumes; CronJob: creates), \
             starts before it"
        ),
        b.cells(|k| {
            format!(
                "{} ({})",
                fmt_pct(b.b(k, "start_share_after")),
                fmt_n(b.b(k, "starts_before"), 0)
            )
        }),
        "–".into(),
        "starts before: 0",
    );
}

/// What a burst cost: API requests per run, resident memory and CPU.
fn burst_cost_rows(t: &mut Table, b: &Burst) {
    let size = b.size;
    t.row3(
        &format!(
            "burst {size}: API requests per run, to start it (preparation − 2 s → last Job + 2 s)"
        ),
        b.fmt("requests_per_run", |x| fmt_n(x, 2)),
        ratio(b.b(SJ, "requests_per_run"), b.b(CJ, "requests_per_run")),
        "",
    );
    let rss = b.cells(|k| {
        format!(
            "{} → {}",
            fmt_mib(b.b(k, "rss_idle_kib")),
            fmt_mib(b.b(k, "rss_peak_kib"))
        )
    });
    t.row3(
        &format!("burst {size}: resident memory idle → peak (KCM for CronJob)"),
        rss,
        ratio(b.b(SJ, "rss_peak_kib"), b.b(CJ, "rss_peak_kib")),
        match size {
            1000 => "SingletonJob < 30 MiB",
            10_000 => "SingletonJob peak < 150 MiB",
            _ => "",
        },
    );
    t.row3(
        &format!("burst {size}: CPU seconds, over the same window"),
        b.fmt("cpu_seconds", |x| fmt_n(x, 2)),
        ratio(b.b(SJ, "cpu_seconds"), b.b(CJ, "cpu_seconds")),
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
/// The controller serves both idle SingletonJobs (with and without preparation): its requests are
/// per run of either, and per minute per object.
fn idle_request_rows(t: &mut Table, r: &Value) {
    t.row(
        "idle: API requests per run, start to completion (and at-rest traffic; both SingletonJobs)",
        fmt_n(p(r, "/idle/SingletonJob/requests_per_run"), 1),
        fmt_n(p(r, "/idle/CronJob/requests_per_run"), 1),
        ratio(
            p(r, "/idle/SingletonJob/requests_per_run"),
            p(r, "/idle/CronJob/requests_per_run"),
        ),
        "",
    );
    t.row(
        "idle: API requests per minute per object (one run each 2 min)",
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
    md.push_str(&format!(
        "SingletonJob: runs prepared {} s ahead of their instant (`--prepare-lead-seconds`; the \
         Job is created suspended then, and counts from its resume). SingletonJob lead 0: the \
         same build without preparation, in the same run. Bursts run {} time(s) each \
         (`BENCH_REPEAT`); a row shows the median run by p99.\n\n",
        fmt_n(p(r, "/prepare_lead_seconds"), 0),
        n(r, "/repeat").max(1)
    ));
    md.push_str("| measure | SingletonJob | SingletonJob lead 0 | CronJob | ratio | target |\n");
    md.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for row in t.0 {
        md.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_burst_row_has_its_bound_its_shares_and_its_lead() {
        let side = |p99: f64, lead: Option<i64>| {
            json!({"n": 100, "jobs_created": 100, "skew": {"p99_ms": p99}, "first_ms": 5.0,
                   "patch_bound_ms": 125.0, "p99_over_patch_bound": p99 / 125.0,
                   "prepare_lead_seconds": lead, "prepared_in_time": 100,
                   "requests_per_run_before": 3.0, "requests_per_run_after": 2.0,
                   "share_before": 0.6, "start_share_after": 0.5, "starts_before": 0,
                   "runs": 2, "p99_spread_ms": [p99, p99 + 10.0]})
        };
        let r = json!({"mode": "quick", "prepare_lead_seconds": 30, "repeat": 2,
                       "raw": {"patches_per_second": 800.0, "patch_round_trip": {"p50_ms": 8.0}},
                       "burst100": {"SingletonJob": side(200.0, Some(30)),
                                    "SingletonJob lead 0": side(900.0, Some(0)),
                                    "CronJob": side(9000.0, None)}});
        let md = markdown(&r);
        for row in [
            "| burst 100: p99 skew ÷ patch bound | 1.60× | 7.20× | 72.00× | – | SingletonJob ≤ 2× |",
            "| burst 100: prepare lead (runs prepared before the instant) | 30 s (100) | 0 s (100) |",
            "| burst 100: share of the requests done before the instant | 60 % | 60 % | 60 % |",
            "| burst 100: skew p99 of 2 runs, min – max (the row: the median run) | 200 ms – 210 ms |",
            "| burst 100: p99 skew ÷ the patch bound 0.99·N/P | 1.60× | ≤ 2× | yes |",
        ] {
            assert!(md.contains(row), "{row} not in\n{md}");
        }
    }
}
