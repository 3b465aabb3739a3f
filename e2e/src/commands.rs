//! The programs tests run besides the controller (kubectl, helm, the kubectl plugin) and the
//! repository paths they need.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};

/// The repository's root (this crate is its `e2e/`).
pub(crate) fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A file of the repository, by its path from the root.
pub fn repo_file(path: &str) -> PathBuf {
    repo_root().join(path)
}

/// The Helm chart, `charts/singleton-controller`.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/singleton-controller")
}

/// `kubectl`: `KUBECTL` (set by `make e2e` to the cached build), else the one on PATH.
pub fn kubectl() -> std::process::Command {
    std::process::Command::new(std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into()))
}

/// `helm`: `HELM` (set by `make e2e` and `make chart` to the cached build), else the one on PATH.
pub fn helm() -> std::process::Command {
    std::process::Command::new(std::env::var_os("HELM").unwrap_or_else(|| "helm".into()))
}

/// Runs `cmd` to completion; its stdout when it exits 0, else an error with its stderr.
pub fn run_ok(cmd: &mut std::process::Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} {:?} failed ({}): {}{}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(stdout(&out))
}

/// What a finished command printed on stdout.
pub fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What a finished command printed on stderr.
pub fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The documents of a multi-document YAML stream (`helm template` output), empty ones skipped.
pub fn yaml_docs(text: &str) -> Result<Vec<serde_yaml::Value>> {
    let mut docs = Vec::new();
    for de in serde_yaml::Deserializer::from_str(text) {
        let v = <serde_yaml::Value as serde::Deserialize>::deserialize(de)?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

// ---- The kubectl plugin ----

/// The plugin as `make e2e` builds it (`cargo build -p singleton-controller --bins`).
pub fn plugin_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    target.join("debug/kubectl-singleton")
}

/// Runs the plugin with `args` (and extra environment); its exit status and output.
pub fn plugin(args: &[&str], envs: &[(&str, &std::ffi::OsStr)]) -> Result<std::process::Output> {
    let bin = plugin_bin();
    std::process::Command::new(&bin)
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .with_context(|| {
            format!(
                "running {} (build it with `cargo build -p singleton-controller --bins`)",
                bin.display()
            )
        })
}

/// Runs kubectl with `args` and `input` on its stdin; its stdout, or why it failed.
pub fn kubectl_stdin(args: &[&str], input: &str) -> Result<String> {
    use std::io::Write as _;
    let mut child = kubectl()
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("kubectl's stdin")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
