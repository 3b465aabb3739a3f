//! Acting as a ServiceAccount, for the RBAC the chart and the docs grant: a kubeconfig with its
//! token, a client from it, and `kubectl auth can-i`.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use kube::Client;

use crate::{kubectl, run_ok};

/// [`Env::service_account_kubeconfig`](crate::Env::service_account_kubeconfig), written into `dir`.
pub(crate) fn write_kubeconfig(dir: &Path, namespace: &str, name: &str) -> Result<PathBuf> {
    let token =
        run_ok(kubectl().args(["create", "token", name, "-n", namespace, "--duration=1h"]))?;
    let view = run_ok(kubectl().args(["config", "view", "--raw", "--minify", "-o", "json"]))?;
    let view: serde_json::Value = serde_json::from_str(&view)?;
    let cluster = &view["clusters"][0]["cluster"];
    let server = cluster["server"]
        .as_str()
        .context("current kubeconfig has no server")?;
    let mut cluster_entry = serde_json::json!({ "server": server });
    match (
        cluster["certificate-authority-data"].as_str(),
        cluster["certificate-authority"].as_str(),
    ) {
        (Some(data), _) => cluster_entry["certificate-authority-data"] = data.into(),
        (None, Some(path)) => cluster_entry["certificate-authority"] = path.into(),
        (None, None) => bail!("current kubeconfig has no certificate authority"),
    }
    // Built as data, not text: a YAML template's indentation is too easy to lose.
    let user = format!("{namespace}-{name}");
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "cluster", "cluster": cluster_entry }],
        "users": [{ "name": user, "user": { "token": token.trim() } }],
        "contexts": [{
            "name": "sa",
            "context": { "cluster": "cluster", "user": user, "namespace": namespace },
        }],
        "current-context": "sa",
    });
    let text = serde_yaml::to_string(&config)?;
    let path = dir.join(format!("{namespace}-{name}.kubeconfig"));
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)?;
        f.write_all(text.as_bytes())?;
    }
    Ok(path)
}

/// A client authenticated by the kubeconfig at `path` (e.g. a ServiceAccount's).
pub async fn client_from_kubeconfig(path: &std::path::Path) -> Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await?;
    Ok(Client::try_from(cfg)?)
}

/// `kubectl auth can-i ARGS` as the kubeconfig at `path`: Ok(true) for "yes", Ok(false) for
/// "no", an error for anything else.
pub fn can_i(kubeconfig: &std::path::Path, args: &[&str]) -> Result<bool> {
    let out = kubectl()
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["auth", "can-i"])
        .args(args)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim() {
        "yes" => Ok(true),
        "no" => Ok(false),
        other => bail!(
            "kubectl auth can-i {args:?}: {other:?} ({})",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}
