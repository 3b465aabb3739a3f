//! The release's versions agree (docs/releasing.md): the crate, the chart's `appVersion` (the
//! image tag it deploys, and what the chart's CRD guard compares on a rollback), and the
//! chart's own version are each `x.y.z` (or `x.y.z-pre`), and the crate's equals `appVersion`.

use std::path::Path;

fn repo_file(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The value of `key: value` at the start of a line of `text`, unquoted.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().trim_matches('"'))
}

/// `x.y.z`, or `x.y.z-pre` (a release candidate).
fn is_semver(v: &str) -> bool {
    let core = v
        .split_once('-')
        .map_or(v, |(core, pre)| if pre.is_empty() { "" } else { core });
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

#[test]
fn the_crate_the_image_and_the_chart_name_one_release() {
    let chart = repo_file("charts/singleton-controller/Chart.yaml");
    let app = field(&chart, "appVersion").expect("Chart.yaml has appVersion");
    let version = field(&chart, "version").expect("Chart.yaml has version");
    let krate = env!("CARGO_PKG_VERSION");
    for (what, v) in [("appVersion", app), ("version", version), ("crate", krate)] {
        assert!(
            is_semver(v),
            "{what} {v:?} is not x.y.z: the chart's CRD guard (templates/crd.yaml) compares it with semverCompare"
        );
    }
    assert_eq!(
        krate, app,
        "the workspace version (Cargo.toml, the image tag make image builds) and the chart's appVersion (the tag it deploys) differ: docs/releasing.md"
    );
    assert!(!is_semver("0.1") && !is_semver("0.1.0-") && !is_semver("v0.1.0"));
    assert!(is_semver("10.0.3") && is_semver("0.2.0-rc.1"));
}
