//! The controller's flags that contradict each other or leave their range are refused at
//! start-up, before it connects to anything, with a message naming them.

use std::process::Command;

/// Runs the controller with `args` and no cluster to reach: its exit code and stderr.
fn controller(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_singleton-controller"))
        .args(args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .output()
        .expect("the controller binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn a_max_lead_below_the_lead_is_refused_before_connecting() {
    let (code, err) = controller(&[
        "--prepare-lead-seconds",
        "60",
        "--prepare-max-lead-seconds",
        "30",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--prepare-max-lead-seconds (30) is below --prepare-lead-seconds (60)"),
        "{err}"
    );
}

#[test]
fn leads_outside_their_range_are_refused_by_name() {
    for (flag, value) in [
        ("--prepare-lead-seconds", "3601"),
        ("--prepare-lead-seconds", "-1"),
        ("--prepare-max-lead-seconds", "3601"),
    ] {
        let (code, err) = controller(&[&format!("{flag}={value}")]);
        assert_eq!(code, Some(2), "{flag} {value}: {err}");
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
}
