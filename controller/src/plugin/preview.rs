//! `kubectl singleton schedule`: a schedule's next instants, written as they are computed (a long
//! preview starts printing at once and holds no list in memory), with a cap on how many.

use std::io::{ErrorKind, Write};

use jiff::Timestamp;

use crate::api::SingletonJob;
use crate::schedule::{Schedule, jitter, preview};

/// The most instants one `schedule` command prints: enough for a year of an every-10-minutes
/// schedule; further ahead is a question for `--from`.
pub const MAX_PREVIEW: usize = 100_000;

/// Parses `-n`: a count from 1 to [`MAX_PREVIEW`], with a message that says what to do instead.
pub fn parse_count(s: &str) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number"))?;
    if n == 0 || n > MAX_PREVIEW {
        return Err(format!(
            "{n} is not between 1 and {MAX_PREVIEW}; to look further ahead, start later with --from"
        ));
    }
    Ok(n)
}

/// A SingletonJob's next periods as its controller sees them (`schedule sj/NAME`): each
/// [`preview`] line, followed by ` skipped (excluded day)` for a period on an excluded day, or
/// ` starts <instant>` when `jitterSeconds` moves its start.
pub fn job_preview<'a>(
    sj: &'a SingletonJob,
    schedule: &'a Schedule,
    key: &'a str,
    from: Timestamp,
    n: usize,
) -> impl Iterator<Item = String> + 'a {
    let window = sj.spec.jitter_window();
    preview(schedule, from, n)
        .zip(schedule.iter_after(from))
        .map(move |(line, at)| {
            if schedule.excluded(at) {
                format!("{line} skipped (excluded day)")
            } else if window > 0 {
                let start = at + jitter(key, at, window);
                format!("{line} starts {}", start.strftime("%Y-%m-%dT%H:%M:%S%.3fZ"))
            } else {
                line
            }
        })
}

/// Writes the preview's lines to `out` as they are computed. A reader that goes away (`| head`)
/// ends the preview quietly.
pub fn write_preview(
    out: &mut impl Write,
    schedule: &Schedule,
    from: Timestamp,
    n: usize,
) -> std::io::Result<()> {
    write_lines(out, preview(schedule, from, n))
}

/// Writes lines to `out` as they come; a reader that goes away ends quietly.
pub fn write_lines(
    out: &mut impl Write,
    lines: impl Iterator<Item = String>,
) -> std::io::Result<()> {
    for line in lines {
        match writeln!(out, "{line}") {
            Err(e) if e.kind() == ErrorKind::BrokenPipe => return Ok(()),
            other => other?,
        }
    }
    match out.flush() {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::DstPolicy;

    fn every_second() -> Schedule {
        Schedule::parse("* * * * * *", None, DstPolicy::default()).unwrap()
    }

    #[test]
    fn count_is_capped_with_a_way_out() {
        assert_eq!(parse_count("5"), Ok(5));
        assert_eq!(parse_count("100000"), Ok(MAX_PREVIEW));
        for bad in ["0", "100001", "5000000"] {
            let e = parse_count(bad).unwrap_err();
            assert!(
                e.contains("between 1 and 100000") && e.contains("--from"),
                "{e}"
            );
        }
        assert!(
            parse_count("lots")
                .unwrap_err()
                .contains("not a whole number")
        );
    }

    /// A writer that takes `room` lines, then reports that its reader went away.
    struct Pipe {
        lines: Vec<String>,
        room: usize,
    }

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.lines.len() == self.room {
                return Err(ErrorKind::BrokenPipe.into());
            }
            self.lines.push(String::from_utf8_lossy(buf).into_owned());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_are_written_as_they_come_and_a_closed_pipe_ends_quietly() {
        let from: Timestamp = "2027-01-01T00:00:00Z".parse().unwrap();
        let mut pipe = Pipe {
            lines: vec![],
            room: 3,
        };
        // The cap's worth of every-second instants; the pipe closes after three.
        write_preview(&mut pipe, &every_second(), from, MAX_PREVIEW).unwrap();
        assert_eq!(pipe.lines.len(), 3);
        assert!(
            pipe.lines[0].starts_with("2027-01-01T00:00:01Z "),
            "{:?}",
            pipe.lines
        );

        let mut all = Vec::new();
        write_preview(&mut all, &every_second(), from, 4).unwrap();
        assert_eq!(String::from_utf8(all).unwrap().lines().count(), 4);
    }

    #[test]
    fn other_write_errors_are_reported() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(ErrorKind::StorageFull.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let from: Timestamp = "2027-01-01T00:00:00Z".parse().unwrap();
        let e = write_preview(&mut Full, &every_second(), from, 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::StorageFull);
    }
}
