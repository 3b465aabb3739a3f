//! Differential test against the parser Kubernetes CronJob uses, robfig/cron v3's
//! `ParseStandard` (`hack/cronref`, built here with Go through the module proxy): thousands of
//! generated CronJob-style schedules, each of which robfig accepts must be accepted here and give
//! the same instants in UTC. Where this crate is deliberately stricter (a schedule that never
//! fires) robfig must find no instant either. robfig's refusals may be accepted here only as
//! the documented supersets (7 as Sunday, Quartz's `L`, `W`, `#`), which this generator does not
//! produce, so every refusal must agree.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use jiff::Timestamp;
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};
use singleton::schedule::{DstPolicy, Schedule, ScheduleError};

/// How many generated schedules are compared, and how many instants of each.
const CASES: usize = 5_000;
const INSTANTS: usize = 10;

/// Builds `hack/cronref` into the test's scratch directory (Go caches the build, so a warm run
/// takes about a second).
fn cronref() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/cronref");
    let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cronref");
    let out = Command::new("go")
        .args(["build", "-mod=readonly", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(&src)
        .env("CGO_ENABLED", "0")
        .output()
        .expect("run `go` (Go is needed to build the reference parser, hack/cronref)");
    assert!(
        out.status.success(),
        "go build in hack/cronref failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// robfig's answer per schedule: `Err(message)`, or its instants (Unix seconds; a trailing 0
/// where it found none within its five-year search).
fn robfig(schedules: &[String], start: Timestamp) -> Vec<Result<Vec<i64>, String>> {
    let mut child = Command::new(cronref())
        .args([start.as_second().to_string(), INSTANTS.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run cronref");
    let mut stdin = child.stdin.take().unwrap();
    let input = schedules.join("\n") + "\n";
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(out.status.success(), "cronref failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let answers: Vec<_> = text
        .lines()
        .map(|line| match line.strip_prefix("ERR ") {
            Some(message) => Err(message.to_string()),
            None => Ok(line.split(' ').map(|n| n.parse().unwrap()).collect()),
        })
        .collect();
    assert_eq!(answers.len(), schedules.len(), "one answer per schedule");
    answers
}

/// A field as robfig bounds it, with its names.
struct Field {
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const FIELDS: [Field; 5] = [
    Field {
        min: 0,
        max: 59,
        names: &[],
    },
    Field {
        min: 0,
        max: 23,
        names: &[],
    },
    Field {
        min: 1,
        max: 31,
        names: &[],
    },
    Field {
        min: 1,
        max: 12,
        names: &[
            "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
        ],
    },
    Field {
        min: 0,
        max: 6,
        names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
    },
];

/// CronJob-style schedules: per field a `*`, `?`, value, range, step form (`*/s`, `a-b/s`,
/// `N/s`) or a list of them, values sometimes written as names (any case) or with a leading zero.
struct Generator(TestRng);

impl Generator {
    fn below(&mut self, n: u32) -> u32 {
        self.0.next_u32() % n
    }

    fn value(&mut self, f: &Field, v: u32) -> String {
        if !f.names.is_empty() && self.below(3) == 0 {
            let name = f.names[(v - f.min) as usize];
            return match self.below(3) {
                0 => name.to_lowercase(),
                _ => name.to_string(),
            };
        }
        if v < 10 && self.below(8) == 0 {
            return format!("0{v}");
        }
        v.to_string()
    }

    fn pick(&mut self, f: &Field) -> u32 {
        f.min + self.below(f.max - f.min + 1)
    }

    fn step(&mut self, f: &Field) -> u32 {
        1 + self.below(f.max - f.min + 3)
    }

    fn item(&mut self, f: &Field) -> String {
        match self.below(7) {
            0 => "*".into(),
            1 => "?".into(),
            2 => {
                let v = self.pick(f);
                self.value(f, v)
            }
            3 | 5 => {
                let (a, b) = (self.pick(f), self.pick(f));
                let (a, b) = (a.min(b), a.max(b));
                let range = format!("{}-{}", self.value(f, a), self.value(f, b));
                if self.below(2) == 0 {
                    format!("{range}/{}", self.step(f))
                } else {
                    range
                }
            }
            4 => format!("*/{}", self.step(f)),
            _ => {
                let v = self.pick(f);
                format!("{}/{}", self.value(f, v), self.step(f))
            }
        }
    }

    fn field(&mut self, f: &Field) -> String {
        if self.below(3) == 0 {
            return "*".into();
        }
        let n = 1 + self.below(3) as usize;
        (0..n).map(|_| self.item(f)).collect::<Vec<_>>().join(",")
    }

    fn schedule(&mut self) -> String {
        FIELDS
            .iter()
            .map(|f| self.field(f))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Schedules the issue that asked for this test named, beside the generated ones.
const NAMED: [&str; 13] = [
    "0 0 * * 0-SUN",
    "0 0 * * SUN-SUN",
    "0 0 * * 0-SUN/2",
    "0 0 * * 0-SUN/3",
    "0 0 * * 1-6",
    "5/15 * * * *",
    "*,15 * * * *",
    "0 0 *,15 * MON",
    "0 0 , * *",
    "0 0 1,,2 * *",
    "0 0 * * L",
    "0 11-2 * * *",
    "0 0 30 2 *",
];

/// What this crate gives for a schedule: an error, or its instants as Unix seconds.
fn ours(expr: &str, start: Timestamp) -> Result<Vec<i64>, ScheduleError> {
    let s = Schedule::parse(expr, None, DstPolicy::default())?;
    Ok(s.iter_after(start)
        .take(INSTANTS)
        .map(|t| t.as_second())
        .collect())
}

#[derive(Default, Debug)]
struct Counts {
    cases: usize,
    identical: usize,
    both_refused: usize,
    never_fires: usize,
}

/// Compares one schedule's answers; `Err` says how they differ.
fn compare(
    expr: &str,
    theirs: &Result<Vec<i64>, String>,
    start: Timestamp,
    counts: &mut Counts,
) -> Result<(), String> {
    // robfig searches five years ahead of the instant it is asked about.
    let beyond_robfig = |t: i64| t > start.as_second() + 5 * 366 * 24 * 3600;
    match (ours(expr, start), theirs) {
        (Err(_), Err(_)) => counts.both_refused += 1,
        // Deliberately stricter: robfig accepts it but finds no instant; the error says why.
        (Err(_), Ok(t)) if t == &[0] => counts.never_fires += 1,
        (Err(e), Ok(_)) => return Err(format!("refused here ({e}), accepted by robfig")),
        (Ok(_), Err(e)) => return Err(format!("accepted here, refused by robfig ({e})")),
        (Ok(mine), Ok(t)) => {
            let until = t.iter().position(|&x| x == 0).unwrap_or(t.len());
            let agree = mine.len() >= until
                && mine[..until] == t[..until]
                && mine
                    .get(until)
                    .is_none_or(|&x| until == t.len() || beyond_robfig(x));
            if !agree {
                return Err(format!("instants differ: here {mine:?}, robfig {t:?}"));
            }
            counts.identical += 1;
        }
    }
    Ok(())
}

#[test]
fn every_cronjob_schedule_is_read_as_cronjob_reads_it_in_utc() {
    let mut generator = Generator(TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let mut schedules: Vec<String> = NAMED.iter().map(|s| s.to_string()).collect();
    schedules.extend((0..CASES).map(|_| generator.schedule()));
    for start in ["2026-01-01T00:00:00Z", "2027-02-27T23:59:30Z"] {
        let start: Timestamp = start.parse().unwrap();
        let answers = robfig(&schedules, start);
        let mut counts = Counts::default();
        let mut differences = Vec::new();
        for (expr, theirs) in schedules.iter().zip(&answers) {
            counts.cases += 1;
            if let Err(why) = compare(expr, theirs, start, &mut counts) {
                differences.push(format!("{expr:?}: {why}"));
            }
        }
        eprintln!(
            "from {start}: {counts:?}, {} differences",
            differences.len()
        );
        assert!(
            differences.is_empty(),
            "{} of {} schedules differ from robfig/cron v3 (from {start}); the first:\n{}",
            differences.len(),
            counts.cases,
            differences[..differences.len().min(25)].join("\n")
        );
    }
}
