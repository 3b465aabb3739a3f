//! Issue 33's acceptance, as ratios within this run, and the lead-0 side against the run
//! committed before prepared runs, with the spread of this run's repeats.
use serde_json::Value;

use super::{CJ, SJ, SJ0, bursts, fmt_mib, fmt_ms, fmt_n, p, patch_limit, ratio};

/// Both tables, under their headings.
pub fn section(r: &Value, baseline: &Value) -> String {
    let mut md = String::from("\n## Issue 33: the acceptance ratios of this run\n\n");
    md.push_str("| ratio | SingletonJob | target | met |\n| --- | --- | --- | --- |\n");
    for row in acceptance(r) {
        md.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    md.push_str(&format!(
        "\n## Lead 0 against the committed run before prepared runs ({}, mode `{}`)\n\n",
        baseline["started"].as_str().unwrap_or("?"),
        baseline["mode"].as_str().unwrap_or("?"),
    ));
    if baseline["mode"] != r["mode"] {
        md.push_str(
            "This run's mode differs from the committed run's: only the rows both have are \
             compared, and their sizes and durations differ.\n\n",
        );
    }
    md.push_str(
        "Lower is better for every figure. Worse beyond the spread: above the committed figure \
         by more than the spread of this run's repeats (max − min; BENCH_REPEAT=1 measures none).\n\n",
    );
    md.push_str("| figure | lead 0 | min – max of the runs | committed | ratio | verdict |\n");
    md.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for row in against_baseline(r, baseline) {
        md.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    md
}

/// "yes", "no", or "–" when a figure is missing.
fn met(v: Option<f64>, ok: impl Fn(f64) -> bool) -> String {
    v.map_or("–".into(), |x| if ok(x) { "yes" } else { "no" }.into())
}

/// A ratio `a ÷ b` and whether it is within `limit`.
fn ratio_row(what: String, a: Option<f64>, b: Option<f64>, limit: f64) -> [String; 4] {
    let q = a.zip(b).filter(|(_, b)| *b > 0.0).map(|(a, b)| a / b);
    [
        what,
        ratio(a, b),
        format!("≤ {limit}×"),
        met(q, |x| x <= limit),
    ]
}

fn acceptance(r: &Value) -> Vec<[String; 4]> {
    let mut rows = Vec::new();
    for (size, k) in bursts(r) {
        let over = p(r, &format!("/{k}/{SJ}/p99_over_patch_bound"));
        let limit = patch_limit(size);
        rows.push([
            format!("burst {size}: p99 skew ÷ the patch bound 0.99·N/P"),
            fmt_n(over, 2) + "×",
            limit.map_or("–".into(), |l| format!("≤ {l}×")),
            limit.map_or("–".into(), |l| met(over, |x| x <= l)),
        ]);
        if size == 10_000 {
            let peak = p(r, &format!("/{k}/{SJ}/rss_peak_kib"));
            rows.push([
                format!("burst {size}: controller's resident memory at the peak"),
                fmt_mib(peak),
                "< 150 MiB".into(),
                met(peak, |x| x < 150.0 * 1024.0),
            ]);
        }
    }
    let idle = p(r, &format!("/idle/{SJ}/skew/p99_ms"));
    rows.push(ratio_row(
        "idle: p99 skew ÷ CronJob's".into(),
        idle,
        p(r, &format!("/idle/{CJ}/skew/p99_ms")),
        0.1,
    ));
    rows.push(ratio_row(
        "idle: p99 skew ÷ a patch's round trip at rest (p50)".into(),
        idle,
        p(r, "/raw/patch_round_trip/p50_ms"),
        1.5,
    ));
    let (sj, cj) = (
        p(r, &format!("/burst100/{SJ}/first_ms")),
        p(r, &format!("/burst100/{CJ}/first_ms")),
    );
    rows.push([
        "burst 100: first Job's skew, SingletonJob vs CronJob".into(),
        format!("{} vs {}", fmt_ms(sj), fmt_ms(cj)),
        "≤ CronJob's".into(),
        match (sj, cj) {
            (Some(a), Some(b)) => if a <= b { "yes" } else { "no" }.into(),
            _ => "–".into(),
        },
    ]);
    rows
}

/// A figure compared: its label, its path in this run (lead 0) and in the committed run, and
/// the path of this run's repeats of it, if kept.
type Compared = (String, String, String, Option<String>);

fn compared(r: &Value, baseline: &Value) -> Vec<Compared> {
    let mut v = Vec::new();
    for q in ["p50", "p99"] {
        v.push((
            format!("idle: skew {q}"),
            format!("/idle/{SJ0}/skew/{q}_ms"),
            format!("/idle/{SJ}/skew/{q}_ms"),
            None,
        ));
    }
    let have: Vec<String> = bursts(baseline).into_iter().map(|(_, k)| k).collect();
    for (size, k) in bursts(r).into_iter().filter(|(_, k)| have.contains(k)) {
        let mut f = |what: &str, field: &str, runs: Option<&str>| {
            v.push((
                format!("burst {size}: {what}"),
                format!("/{k}/{SJ0}/{field}"),
                format!("/{k}/{SJ}/{field}"),
                runs.map(|runs| format!("/{k}/{SJ0}/{runs}")),
            ));
        };
        f("skew p50", "skew/p50_ms", Some("p50_runs_ms"));
        f("skew p99", "skew/p99_ms", Some("p99_runs_ms"));
        f("skew max", "skew/max_ms", None);
        f("last Job exists after", "last_ms", None);
        f("API requests per run", "requests_per_run", None);
        f("resident memory at the peak (KiB)", "rss_peak_kib", None);
        f("CPU seconds", "cpu_seconds", None);
    }
    v
}

/// Each compared figure: this run's lead 0 (the committed run's was the only SingletonJob side,
/// without preparation), the spread of its repeats, the committed figure, and the verdict.
fn against_baseline(r: &Value, baseline: &Value) -> Vec<[String; 6]> {
    compared(r, baseline)
        .into_iter()
        .filter_map(|(what, now, then, runs)| {
            let now_v = p(r, &now)?;
            let then_v = p(baseline, &then)?;
            let runs: Vec<f64> = runs
                .and_then(|path| r.pointer(&path)?.as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter_map(Value::as_f64)
                .collect();
            let spread = crate::stats::spread(&runs).filter(|_| runs.len() > 1);
            let fmt = |x: Option<f64>| {
                if what.contains("KiB") {
                    fmt_mib(x)
                } else if what.contains("skew") || what.contains("after") {
                    fmt_ms(x)
                } else {
                    fmt_n(x, 2)
                }
            };
            Some([
                what.replace(" (KiB)", ""),
                fmt(Some(now_v)),
                spread.map_or("–".into(), |(lo, hi)| {
                    format!("{} – {}", fmt(Some(lo)), fmt(Some(hi)))
                }),
                fmt(Some(then_v)),
                ratio(Some(now_v), Some(then_v)),
                verdict(now_v, then_v, spread).into(),
            ])
        })
        .collect()
}

/// Whether `now` is worse than `then` (lower is better) beyond the `spread` of repeated runs.
pub fn verdict(now: f64, then: f64, spread: Option<(f64, f64)>) -> &'static str {
    match spread {
        _ if now <= then => "not worse",
        Some((lo, hi)) if now - then <= hi - lo => "worse, within the spread",
        Some(_) => "worse beyond the spread",
        None => "worse (no spread measured)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn verdicts() {
        assert_eq!(verdict(9.0, 10.0, None), "not worse");
        assert_eq!(
            verdict(11.0, 10.0, Some((9.0, 12.0))),
            "worse, within the spread"
        );
        assert_eq!(
            verdict(14.0, 10.0, Some((9.0, 12.0))),
            "worse beyond the spread"
        );
        assert_eq!(verdict(11.0, 10.0, None), "worse (no spread measured)");
    }

    #[test]
    fn ratios_of_the_acceptance() {
        let r = json!({
            "raw": {"patch_round_trip": {"p50_ms": 10.0}},
            "idle": {"SingletonJob": {"skew": {"p99_ms": 12.0}},
                     "CronJob": {"skew": {"p99_ms": 110.0}}},
            "burst100": {"SingletonJob": {"n": 100, "p99_over_patch_bound": 1.8, "first_ms": 20.0},
                         "CronJob": {"n": 100, "first_ms": 150.0}},
            "burst1000": {"SingletonJob": {"n": 1000, "p99_over_patch_bound": 1.6}},
        });
        let rows = acceptance(&r);
        let met = |what: &str| {
            rows.iter()
                .find(|row| row[0].starts_with(what))
                .map(|row| row[3].clone())
        };
        assert_eq!(met("burst 100: p99").as_deref(), Some("yes"));
        assert_eq!(met("burst 1000: p99").as_deref(), Some("no"));
        assert_eq!(met("idle: p99 skew ÷ CronJob").as_deref(), Some("no"));
        assert_eq!(met("idle: p99 skew ÷ a patch").as_deref(), Some("yes"));
        assert_eq!(met("burst 100: first").as_deref(), Some("yes"));
    }

    #[test]
    fn lead_zero_against_the_committed_run() {
        let r = json!({"burst100": {"SingletonJob lead 0": {
            "skew": {"p99_ms": 1100.0}, "p99_runs_ms": [900.0, 1100.0, 1300.0]}}});
        let baseline = json!({"burst100": {"SingletonJob": {"skew": {"p99_ms": 1000.0}}}});
        let rows = against_baseline(&r, &baseline);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0][0], "burst 100: skew p99");
        assert_eq!(rows[0][2], "900 ms – 1300 ms");
        assert_eq!(rows[0][5], "worse, within the spread");
    }
}
