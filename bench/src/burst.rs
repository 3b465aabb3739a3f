//! Bursts: N objects due at the same instant. The SingletonJob side runs twice, with runs
//! prepared [`PREPARE_LEAD`] ahead and without (lead 0); then the CronJob side. BENCH_REPEAT runs
//! them all k times; each row shows its median run (by p99) and the spread of the k.
use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use serde_json::{Value, json};
use singleton::decide::prepare::lead;

use crate::audit::{self, Request};
use crate::{
    Bench, CJ, PREPARE_LEAD, SJ, SJ0, create_all, cron_job, daily_at, minute_after, ms, procs,
    singleton_job, skews, sleep_until, stats, step,
};

/// Who runs a burst: SingletonJob preparing `lead` seconds ahead, or CronJob.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Side {
    kind: &'static str,
    lead: i64,
}

impl Side {
    /// The side's key in results.json and name in the plot.
    fn key(self) -> &'static str {
        match (self.kind == SJ, self.lead) {
            (true, 0) => SJ0,
            (true, _) => SJ,
            _ => CJ,
        }
    }

    fn tag(self) -> &'static str {
        match self.key() {
            SJ0 => "sj0",
            SJ => "sj",
            _ => "cj",
        }
    }
}

/// One burst's run: its row in results.json and its skews (ms).
type Run = (Value, Vec<f64>);

impl Bench {
    /// Every burst size with each side, BENCH_REPEAT times, then (full runs) the big burst with
    /// the lead only; each row keeps its median run, with the spread of all.
    pub(crate) async fn bursts(&mut self) -> anyhow::Result<()> {
        let sides = [
            Side { kind: SJ, lead: 0 },
            Side {
                kind: SJ,
                lead: PREPARE_LEAD,
            },
            Side { kind: CJ, lead: 0 },
        ];
        let mut runs: BTreeMap<(usize, &'static str), Vec<Run>> = BTreeMap::new();
        for rep in 0..self.repeat {
            for n in self.sizes.bursts.clone() {
                step(&format!("burst of {n}, run {} of {}", rep + 1, self.repeat));
                for side in sides {
                    let run = self.burst(n, side, rep).await?;
                    runs.entry((n, side.key())).or_default().push(run);
                }
            }
        }
        if let Some(n) = self.sizes.big_burst {
            step(&format!(
                "burst of {n} (SingletonJob, lead {PREPARE_LEAD} s)"
            ));
            let side = Side {
                kind: SJ,
                lead: PREPARE_LEAD,
            };
            let run = self.burst(n, side, 0).await?;
            runs.entry((n, side.key())).or_default().push(run);
        }
        for ((n, key), v) in runs {
            let (row, skews) = median_run(v)?;
            self.res
                .entry(format!("burst{n}"))
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .ok_or_else(|| anyhow::anyhow!("burst{n} is not an object"))?
                .insert(key.into(), row);
            self.series.push((format!("burst {n}"), key, skews));
        }
        Ok(())
    }

    /// `n` objects due in the same minute, created long enough before it for `side`'s lead. Also
    /// the footprint at `n` idle objects (settled, before any preparation) and from the
    /// preparation (2 s before it; lead 0: 2 s before the instant) to the last Job, and the
    /// requests per run, before and after the instant.
    async fn burst(&mut self, n: usize, side: Side, rep: usize) -> anyhow::Result<Run> {
        let again = if rep > 0 {
            format!("-r{rep}")
        } else {
            String::new()
        };
        let tag = format!("burst{n}-{}{again}", side.tag());
        let ns = self.namespace(&tag).await?;
        let (ctl, pid, user) = self.actor(side.kind, &tag, side.lead).await?;
        let lead = SignedDuration::from_secs(side.lead);
        let due = minute_after(lead + SignedDuration::from_secs(25 + (n as i64) / 25))?;
        self.create_due(side.kind, &ns, n, &daily_at(due)).await?;
        // The window measured opens 2 s before the first preparation (lead 0: the instant): at
        // the lead the controller gives a burst of n before it has measured the API server's
        // rate (the adaptive lead, at most the default cap), if longer than the flag's. A burst
        // of 10,000 is prepared from right after its creation: the window opened 32 s before
        // the instant missed every preparation.
        let adaptive = lead::adaptive_lead(
            lead,
            SignedDuration::from_secs(600),
            n,
            lead::REQUESTS_PER_PREPARATION,
            None,
        );
        let from = due - adaptive - SignedDuration::from_secs(2);
        let max = (from - SignedDuration::from_secs(1))
            .duration_since(Timestamp::now())
            .max(SignedDuration::ZERO)
            .unsigned_abs();
        procs::settle(pid, max).await;
        let rss_idle = procs::rss_kib(pid);
        sleep_until(from).await;
        let mark = self.audit.mark();
        let from = Timestamp::now();
        let cpu0 = procs::cpu_secs(pid);
        let peak = procs::PeakRss::start(pid);
        let deadline = due + SignedDuration::from_secs(120 + (n as i64) / 2);
        let jobs = self.wait_creates(mark, user, &ns, n, deadline).await?;
        let last = jobs.iter().map(|j| j.1).max().unwrap_or(due);
        // What starting the runs costs: until 2 s after the last Job (its confirm, its Event).
        // Completions trickle in for minutes behind the Job controller's own client-side rate
        // limit (20 requests/s), for both sides; the idle workload counts them.
        let to = last + SignedDuration::from_secs(2);
        sleep_until(to).await;
        let cpu = procs::cpu_secs(pid) - cpu0;
        let rss_peak = peak.peak_kib();
        drop(peak);
        let reqs = self.audit.since(mark)?;
        let skews = skews(&jobs, side.kind);
        let at = Window { from, due, to };
        let mut row = figures(n, side, &jobs, &skews, &reqs, (user, &ns), at);
        row["rss_idle_kib"] = json!(rss_idle);
        row["rss_peak_kib"] = json!(rss_peak);
        row["cpu_seconds"] = json!(cpu);
        self.against_patch_bound(&mut row, n);
        eprintln!(
            "bench:   {}: {} of {n} Jobs, p99 {:.0} ms, first {:.0} ms, last {:.0} ms",
            side.key(),
            jobs.len(),
            row["skew"]["p99_ms"].as_f64().unwrap_or(f64::NAN),
            row["first_ms"].as_f64().unwrap_or(f64::NAN),
            ms(last.duration_since(due))
        );
        if let Some(c) = ctl {
            c.stop().await?;
        }
        self.cleanup(&ns).await?;
        Ok((row, skews))
    }

    /// `n` objects of `kind` in `ns` on `schedule`.
    async fn create_due(
        &self,
        kind: &str,
        ns: &str,
        n: usize,
        schedule: &str,
    ) -> anyhow::Result<()> {
        let names = (0..n).map(|i| format!("b{i}"));
        if kind == SJ {
            let objs = names
                .map(|nm| singleton_job(&nm, schedule, "Forbid"))
                .collect::<anyhow::Result<Vec<_>>>()?;
            create_all(&Api::namespaced(self.client.clone(), ns), objs, 32).await
        } else {
            let objs = names
                .map(|nm| cron_job(&nm, schedule, "Forbid"))
                .collect::<anyhow::Result<Vec<_>>>()?;
            create_all(&Api::namespaced(self.client.clone(), ns), objs, 32).await
        }
    }

    /// The burst's p99 against the raw patch bound of the same run, where it was measured.
    fn against_patch_bound(&self, row: &mut Value, n: usize) {
        let rate = self
            .res
            .get("raw")
            .and_then(|r| r["patches_per_second"].as_f64());
        let Some(bound) = rate.and_then(|p| stats::bound_ms(n, p)) else {
            return;
        };
        row["patch_bound_ms"] = json!(bound);
        row["p99_over_patch_bound"] = json!(row["skew"]["p99_ms"].as_f64().map(|p| p / bound));
    }
}

/// A burst's window: from 2 s before its first preparation to 2 s after its last Job, split at
/// its instant `due`.
#[derive(Clone, Copy, Debug)]
struct Window {
    from: Timestamp,
    due: Timestamp,
    to: Timestamp,
}

/// The row of one burst run from what the audit log says: skew (first Job too), requests per
/// run, and how they fall on either side of the instant.
fn figures(
    n: usize,
    side: Side,
    jobs: &[(String, Timestamp)],
    skews: &[f64],
    reqs: &[Request],
    (user, ns): (&str, &str),
    w: Window,
) -> Value {
    let last = jobs.iter().map(|j| j.1).max().unwrap_or(w.due);
    let requests = audit::count(reqs, user, w.from, w.to);
    let split = audit::split(reqs, user, ns, (w.from, w.due, w.to));
    let per_run = |k: usize| k as f64 / n.max(1) as f64;
    let mut row = json!({
        "n": n,
        "jobs_created": jobs.len(),
        "skew": stats::summary(skews),
        "first_ms": skews.iter().copied().reduce(f64::min),
        "last_ms": ms(last.duration_since(w.due)),
        "requests": requests,
        "requests_per_run": per_run(requests),
        "request_breakdown": audit::breakdown(reqs, user, w.from, w.to),
        "requests_before": split.before,
        "requests_after": split.after,
        "requests_per_run_before": per_run(split.before),
        "requests_per_run_after": per_run(split.after),
        "share_before": split.share_before(),
        "starts_before": split.starts_before,
        "starts_after": split.starts_after,
        "start_share_after": split.start_share_after(),
    });
    if side.kind == SJ {
        row["prepare_lead_seconds"] = json!(side.lead);
        row["prepared_in_time"] = json!(audit::created_before(reqs, user, ns, w.due));
    }
    row
}

/// The run that stands for repeated ones (the median by p99), with the spread of all: their p99,
/// p50 and first Job's skew, each run's in order.
fn median_run(mut runs: Vec<Run>) -> anyhow::Result<Run> {
    let of = |runs: &[Run], q: &str| -> Vec<f64> {
        runs.iter()
            .map(|(row, _)| row.pointer(q).and_then(Value::as_f64).unwrap_or(f64::NAN))
            .collect()
    };
    let p99 = of(&runs, "/skew/p99_ms");
    let (p50, first) = (of(&runs, "/skew/p50_ms"), of(&runs, "/first_ms"));
    // A run without Jobs (no p99) counts as the slowest.
    let key: Vec<f64> = p99
        .iter()
        .map(|x| if x.is_nan() { f64::INFINITY } else { *x })
        .collect();
    let i = stats::median_index(&key).ok_or_else(|| anyhow::anyhow!("a burst without runs"))?;
    let (mut row, skews) = runs.swap_remove(i);
    row["runs"] = json!(key.len());
    row["p99_runs_ms"] = json!(p99);
    row["p50_runs_ms"] = json!(p50);
    row["first_runs_ms"] = json!(first);
    row["p99_spread_ms"] = json!(stats::spread(&key));
    Ok((row, skews))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p99: Option<f64>) -> Run {
        (
            json!({"skew": {"p99_ms": p99, "p50_ms": 1.0}, "first_ms": 0.5}),
            vec![],
        )
    }

    #[test]
    fn the_median_run_stands_for_the_repeats() {
        let (row, _) = median_run(vec![run(Some(30.0)), run(Some(10.0)), run(Some(20.0))]).unwrap();
        assert_eq!(row["skew"]["p99_ms"], 20.0);
        assert_eq!(row["runs"], 3);
        assert_eq!(row["p99_runs_ms"], json!([30.0, 10.0, 20.0]));
        assert_eq!(row["p99_spread_ms"], json!([10.0, 30.0]));
        // A run whose Jobs never came is the worst, not a gap.
        let (row, _) = median_run(vec![run(None), run(Some(10.0)), run(Some(20.0))]).unwrap();
        assert_eq!(row["skew"]["p99_ms"], 20.0);
        assert!(median_run(vec![]).is_err());
    }

    #[test]
    fn sides() {
        let side = |kind, lead| Side { kind, lead };
        assert_eq!(side(SJ, 0).key(), SJ0);
        assert_eq!(side(SJ, 30).key(), SJ);
        assert_eq!(side(CJ, 0).key(), CJ);
        assert_eq!(side(SJ, 30).tag(), "sj");
    }
}
