//! `kubectl singleton schedule` as a user runs it: the binary, its output format and its errors.

use std::process::Command;

fn schedule(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-singleton"))
        .arg("schedule")
        .args(args)
        .output()
        .expect("run kubectl-singleton");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn prints_utc_instant_then_local_wall_time_across_a_dst_gap() {
    let (ok, out, err) = schedule(&[
        "30 2 * * *",
        "--time-zone",
        "Europe/Berlin",
        "--from",
        "2027-03-27T12:00:00Z",
        "-n",
        "2",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "2027-03-28T01:00:00Z 2027-03-28T03:00:00+02:00[Europe/Berlin]\n\
         2027-03-29T00:30:00Z 2027-03-29T02:30:00+02:00[Europe/Berlin]\n"
    );
}

#[test]
fn the_dst_policy_flags_change_the_placement() {
    let (_, shifted, _) = schedule(&[
        "30 2 * * *",
        "--time-zone",
        "Europe/Berlin",
        "--from",
        "2027-03-27T12:00:00Z",
        "-n",
        "1",
        "--gap",
        "Shift",
    ]);
    assert_eq!(
        shifted,
        "2027-03-28T01:30:00Z 2027-03-28T03:30:00+02:00[Europe/Berlin]\n"
    );
    let (_, last, _) = schedule(&[
        "30 2 * * *",
        "--time-zone",
        "Europe/Berlin",
        "--from",
        "2027-10-30T12:00:00Z",
        "-n",
        "1",
        "--fold",
        "Last",
    ]);
    assert_eq!(
        last,
        "2027-10-31T01:30:00Z 2027-10-31T02:30:00+01:00[Europe/Berlin]\n"
    );
}

#[test]
fn standard_cron_rules_hold() {
    // Day-of-month OR day-of-week when both are restricted: the 13th, or any Friday.
    let (_, out, _) = schedule(&["0 0 13 * FRI", "--from", "2027-08-01T00:00:00Z", "-n", "3"]);
    let days: Vec<&str> = out.lines().map(|l| &l[..10]).collect();
    assert_eq!(days, ["2027-08-06", "2027-08-13", "2027-08-20"]);
    // 0 and 7 are both Sunday.
    let (_, a, _) = schedule(&["0 0 * * 0", "--from", "2027-08-01T00:00:00Z", "-n", "2"]);
    let (_, b, _) = schedule(&["0 0 * * 7", "--from", "2027-08-01T00:00:00Z", "-n", "2"]);
    assert_eq!(a, b);
    // Seconds and macros.
    let (_, s, _) = schedule(&[
        "*/20 * * * * *",
        "--from",
        "2027-01-01T00:00:00Z",
        "-n",
        "2",
    ]);
    assert!(
        s.starts_with("2027-01-01T00:00:20Z") && s.contains("2027-01-01T00:00:40Z"),
        "{s}"
    );
    let (_, d, _) = schedule(&["@daily", "--from", "2027-01-01T00:00:00Z", "-n", "1"]);
    assert!(d.starts_with("2027-01-02T00:00:00Z"), "{d}");
}

#[test]
fn bad_input_is_a_clear_error_and_exit_code_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-singleton"))
        .args(["schedule", "61 * * * *"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("61"),
        "message names the bad value"
    );
    let (ok, _, err) = schedule(&["* * * * *", "--time-zone", "Mars/Olympus_Mons"]);
    assert!(!ok && err.contains("unknown time zone"), "{err}");
}
