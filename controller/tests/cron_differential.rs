//! Differential tests against the parser Kubernetes CronJob uses, robfig/cron v3's
//! `ParseStandard` (`hack/cronref`, built here with Go through the module proxy).
//!
//! In UTC: thousands of generated CronJob-style schedules, each of which robfig accepts must be
//! accepted here and give the same instants. Where this crate is deliberately stricter (a
//! schedule that never fires) robfig must find no instant either. robfig's refusals may be
//! accepted here only as the documented supersets (7 as Sunday, Quartz's `L`, `W`, `#`), which
//! the generator does not produce, so every refusal must agree.
//!
//! In 14 zones with daylight-saving changes: every instant around each 2027 change must agree,
//! or differ in a way the declared DST policy explains (a skipped wall time runs once at the
//! jump; a repeated one runs once, at its first occurrence), or in one of robfig's own errors
//! near changes at local midnight or off the hour, each named and counted. Our placements there
//! are checked against an independent oracle by the schedule engine's property tests.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{SignedDuration, Timestamp};
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

/// Runs cronref with `args`, one input line per item of `lines`; its output.
fn run_cronref(args: &[String], lines: &[String]) -> String {
    let mut child = Command::new(cronref())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run cronref");
    let mut stdin = child.stdin.take().unwrap();
    let input = lines.join("\n") + "\n";
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(out.status.success(), "cronref {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

/// robfig's answer per schedule: `Err(message)`, or its instants (Unix seconds; a trailing 0
/// where it found none within its five-year search).
fn robfig(schedules: &[String], start: Timestamp) -> Vec<Result<Vec<i64>, String>> {
    let args = [start.as_second().to_string(), INSTANTS.to_string()];
    let text = run_cronref(&args, schedules);
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

/// Zones with daylight-saving changes in 2027: an hour at 02:00 or 03:00 local (Europe, North
/// America, Australia, New Zealand), half an hour (Lord Howe), at 02:45 (Chatham), at local
/// midnight (Santiago, Havana, Beirut, Cairo), on a Friday (Jerusalem), and at -03:30 (St John's).
const DST_ZONES: [&str; 14] = [
    "Europe/Berlin",
    "Europe/London",
    "America/New_York",
    "America/Los_Angeles",
    "America/St_Johns",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "Pacific/Auckland",
    "Pacific/Chatham",
    "America/Santiago",
    "America/Havana",
    "Asia/Beirut",
    "Asia/Jerusalem",
    "Africa/Cairo",
];

/// Schedules that fire a few times a day at most, so a window around a change stays small:
/// minutes restricted, hours often near the changes, days sometimes restricted.
fn dst_schedule(g: &mut Generator) -> String {
    let minute = match g.below(4) {
        0 => "0".to_string(),
        1 => "30".to_string(),
        2 => format!("{}", g.below(60)),
        _ => format!("{},{}", g.below(30), 30 + g.below(30)),
    };
    let hour = match g.below(6) {
        0 => "*".to_string(),
        1 => format!("{}", [0, 1, 2, 3, 23][g.below(5) as usize]),
        2 => format!("{}-{}", g.below(3), 2 + g.below(4)),
        3 => format!("*/{}", 1 + g.below(4)),
        4 => format!("{}/{}", g.below(4), 2 + g.below(3)),
        _ => format!("{}", g.below(24)),
    };
    let day_of_week = match g.below(4) {
        0 => FIELDS[4].names[g.below(7) as usize].to_string(),
        1 => format!("{}-{}", g.below(3), 4 + g.below(3)),
        _ => "*".to_string(),
    };
    let day_of_month = if g.below(5) == 0 { "1-15" } else { "*" };
    format!("{minute} {hour} {day_of_month} * {day_of_week}")
}

/// Why a difference from robfig is explained: by this crate's DST policy (AfterGap, First), or
/// by robfig's own errors near changes it does not model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Explained {
    /// Here only: a skipped wall time runs once at the jump (robfig skips it, or runs it later).
    RunAtTheJump,
    /// robfig only: a skipped wall time run at its time shifted by the jump.
    RobfigShiftsASkippedTime,
    /// robfig only: the second occurrence of a repeated wall time (robfig runs both).
    SecondOccurrence,
    /// Either side, within a day of a change at local midnight (Beirut, Cairo, Santiago): robfig
    /// steps days by civil midnights that do not exist or exist twice, and drops a day's runs or
    /// runs on a day the schedule excludes.
    MidnightChange,
    /// Either side, within a day of a change that is not a whole hour (Lord Howe's 30 minutes) or
    /// not on the hour (Chatham's 02:45): robfig corrects for changes an hour at a time, and runs
    /// wall times the schedule does not name, drops a day's runs, or stops advancing.
    OffTheHourChange,
}

/// A change of a zone's offset: when, by how much, and the wall times just before and after it.
struct Change {
    at: Timestamp,
    jump: SignedDuration,
    wall_before: jiff::civil::DateTime,
    wall_after: jiff::civil::DateTime,
}

fn explain(tz: &TimeZone, t: Timestamp, here: bool, ours: &[i64]) -> Option<Explained> {
    let day = SignedDuration::from_hours(48);
    let changes: Vec<Change> = tz
        .preceding(t + day + SignedDuration::from_hours(1))
        .take_while(|c| c.timestamp() > t - day - SignedDuration::from_hours(1))
        .map(|c| {
            let before = tz.to_offset(c.timestamp() - SignedDuration::from_nanos(1));
            Change {
                at: c.timestamp(),
                jump: c.offset().duration_since(before),
                wall_before: before.to_datetime(c.timestamp()),
                wall_after: c.offset().to_datetime(c.timestamp()),
            }
        })
        .collect();
    let near = |c: &Change| t.duration_since(c.at).abs() <= day;
    let midnight = |w: jiff::civil::DateTime| w.hour() == 0 && w.minute() == 0;
    if changes
        .iter()
        .any(|c| near(c) && (midnight(c.wall_before) || midnight(c.wall_after)))
    {
        return Some(Explained::MidnightChange);
    }
    if changes
        .iter()
        .any(|c| near(c) && (c.jump.as_secs() % 3600 != 0 || c.wall_before.minute() != 0))
    {
        return Some(Explained::OffTheHourChange);
    }
    if here {
        return changes
            .iter()
            .any(|c| c.at == t && c.jump.is_positive())
            .then_some(Explained::RunAtTheJump);
    }
    if changes
        .iter()
        .any(|c| c.jump.is_positive() && c.at <= t && t < c.at + c.jump)
    {
        return Some(Explained::RobfigShiftsASkippedTime);
    }
    let wall = t.to_zoned(tz.clone()).datetime();
    match tz.to_ambiguous_timestamp(wall).offset() {
        AmbiguousOffset::Fold { before, after } => {
            let first = before.to_timestamp(wall).ok()?;
            (after.to_timestamp(wall).ok()? == t && ours.contains(&first.as_second()))
                .then_some(Explained::SecondOccurrence)
        }
        _ => None,
    }
}

#[test]
fn cronjob_schedules_in_daylight_saving_zones_differ_only_as_explained() {
    let mut generator = Generator(TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let mut schedules: Vec<String> = [
        "30 2 * * *",
        "0 * * * *",
        "*/30 * * * *",
        "0 0 * * *",
        "30 0 * * *",
        "0 0 * * SUN",
        "15 1 * * *",
        "45 23 * * *",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    schedules.extend((0..250).map(|_| dst_schedule(&mut generator)));
    let year = |y: i16| {
        jiff::civil::date(y, 1, 1)
            .at(0, 0, 0, 0)
            .to_zoned(TimeZone::UTC)
            .unwrap()
            .timestamp()
    };
    let margin = SignedDuration::from_hours(30);
    let mut lines = Vec::new();
    let mut cases = Vec::new();
    for zone in DST_ZONES {
        // The zone as the schedule engine has it (its bundled tz database), not the host's.
        let tz = Schedule::parse("0 0 * * *", Some(zone), DstPolicy::default())
            .unwrap()
            .time_zone()
            .clone();
        let changes: Vec<Timestamp> = tz
            .following(year(2027))
            .map(|c| c.timestamp())
            .take_while(|&at| at < year(2028))
            .collect();
        assert!(!changes.is_empty(), "{zone} has no change in 2027");
        for change in changes {
            let (start, end) = (change - margin, change + margin);
            for expr in &schedules {
                lines.push(format!(
                    "{zone} {} {} {expr}",
                    start.as_second(),
                    end.as_second()
                ));
                cases.push((zone, tz.clone(), start, end, expr.clone()));
            }
        }
    }
    let answers = robfig_windows(&lines);
    let mut identical = 0;
    let mut explained: std::collections::BTreeMap<Explained, usize> = Default::default();
    let mut unexplained = Vec::new();
    let mut stuck = Vec::new();
    for ((zone, tz, start, end, expr), answer) in cases.iter().zip(answers) {
        let (theirs, until) = match answer {
            Ok(Window::Instants(all)) => (all, *end),
            // Compared up to where robfig stopped advancing.
            Ok(Window::Stuck(at, before)) => {
                let at = Timestamp::from_second(at).unwrap();
                stuck.push(format!("{zone} {expr:?} at {}", at.to_zoned(tz.clone())));
                (before, at - SignedDuration::from_secs(1))
            }
            Err(e) => panic!("robfig refused {expr:?}: {e}"),
        };
        let schedule = Schedule::parse(expr, Some(zone), DstPolicy::default()).unwrap();
        let ours: Vec<i64> = schedule
            .iter_after(*start)
            .take_while(|t| *t <= until)
            .map(|t| t.as_second())
            .collect();
        if ours == theirs {
            identical += 1;
            continue;
        }
        let only = |a: &[i64], b: &[i64]| {
            a.iter()
                .filter(|t| !b.contains(t))
                .copied()
                .collect::<Vec<_>>()
        };
        let here = only(&ours, &theirs).into_iter().map(|t| (true, t));
        let there = only(&theirs, &ours).into_iter().map(|t| (false, t));
        for (here, t) in here.chain(there) {
            let at = Timestamp::from_second(t).unwrap();
            match explain(tz, at, here, &ours) {
                Some(why) => *explained.entry(why).or_default() += 1,
                None => unexplained.push(format!(
                    "{zone} {expr:?}: {} only {}",
                    if here { "here" } else { "robfig" },
                    at.to_zoned(tz.clone())
                )),
            }
        }
    }
    eprintln!(
        "{} windows ({} zones, {} schedules, each 2027 change ±30 h): {identical} identical; \
         differences explained {explained:?}; robfig stopped advancing in {}: {:?}; \
         {} unexplained",
        cases.len(),
        DST_ZONES.len(),
        schedules.len(),
        stuck.len(),
        &stuck[..stuck.len().min(5)],
        unexplained.len()
    );
    assert!(
        unexplained.is_empty(),
        "{} differences from robfig/cron v3 that nothing explains; the first:\n{}",
        unexplained.len(),
        unexplained[..unexplained.len().min(25)].join("\n")
    );
}

/// robfig's answer for one window.
enum Window {
    Instants(Vec<i64>),
    /// robfig's Next returned this instant, not after the one it was given (it would loop),
    /// after the instants before it.
    Stuck(i64, Vec<i64>),
}

/// robfig's instants in each window (`cronref window`).
fn robfig_windows(lines: &[String]) -> Vec<Result<Window, String>> {
    let text = run_cronref(&["window".to_string()], lines);
    let answers: Vec<_> = text
        .lines()
        .map(|line| {
            if let Some(message) = line.strip_prefix("ERR ") {
                return Err(message.to_string());
            }
            let numbers = |text: &str| -> Vec<i64> {
                text.split_whitespace()
                    .map(|n| n.parse().unwrap())
                    .collect()
            };
            Ok(match line.strip_prefix("STUCK ") {
                Some(rest) => {
                    let all = numbers(rest);
                    Window::Stuck(all[0], all[1..].to_vec())
                }
                None => Window::Instants(numbers(line)),
            })
        })
        .collect();
    assert_eq!(answers.len(), lines.len(), "one answer per window");
    answers
}
