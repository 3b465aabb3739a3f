//! Rendering tests of the Helm chart (`helm template`, no cluster): the important values produce
//! the objects and the restrictions they promise. `make chart` runs these with `helm lint`;
//! tests/chart.rs installs the chart into the real control plane.

use anyhow::{Context as _, Result, bail, ensure};
use e2e::{chart_dir, helm, repo_file, run_ok, yaml_docs};
use serde_yaml::Value;

const RELEASE: &str = "sc";
const NS: &str = "singleton-system";
const FULLNAME: &str = "sc-singleton-controller";

/// `helm template` in the release namespace: flags (`--...`) as given, anything else as `--set`.
fn template(args: &[&str]) -> std::process::Command {
    let mut cmd = helm();
    cmd.args(["template", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", NS]);
    for a in args {
        if a.starts_with("--") {
            cmd.arg(a);
        } else {
            cmd.args(["--set", a]);
        }
    }
    cmd
}

/// The rendered objects.
fn render(args: &[&str]) -> Result<Vec<Value>> {
    yaml_docs(&run_ok(&mut template(args))?)
}

/// Rendering that must fail; its error text.
fn render_err(args: &[&str]) -> Result<String> {
    let out = template(args).output()?;
    ensure!(!out.status.success(), "helm template {args:?} succeeded");
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

fn kind_of(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or_default()
}

fn name_of(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or_default()
}

fn all<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| kind_of(d) == kind).collect()
}

fn one<'a>(docs: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    docs.iter()
        .find(|d| kind_of(d) == kind && name_of(d) == name)
        .with_context(|| format!("no {kind} {name} rendered"))
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_sequence()
        .map(|s| s.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The verbs a rules list grants on `group/resource`, across all its rules.
fn verbs(rules: &Value, group: &str, resource: &str) -> Vec<String> {
    let mut out = Vec::new();
    for r in rules.as_sequence().into_iter().flatten() {
        if strs(&r["apiGroups"]).contains(&group) && strs(&r["resources"]).contains(&resource) {
            out.extend(strs(&r["verbs"]).into_iter().map(String::from));
        }
    }
    out.sort();
    out.dedup();
    out
}

fn container(docs: &[Value]) -> Result<&Value> {
    let d = one(docs, "Deployment", FULLNAME)?;
    Ok(&d["spec"]["template"]["spec"]["containers"][0])
}

fn args(docs: &[Value]) -> Result<Vec<String>> {
    Ok(strs(&container(docs)?["args"])
        .into_iter()
        .map(String::from)
        .collect())
}

/// Rules of a Role/ClusterRole must never use wildcards.
fn no_wildcards(role: &Value) -> Result<()> {
    for r in role["rules"].as_sequence().into_iter().flatten() {
        for key in ["apiGroups", "resources", "verbs"] {
            ensure!(
                !strs(&r[key]).contains(&"*"),
                "wildcard in {} {}: {r:?}",
                kind_of(role),
                name_of(role)
            );
        }
    }
    Ok(())
}

/// The SingletonJob, SingletonJob-status, SingletonCalendar, Job, Event and Secret grants of the
/// controller.
fn check_work_rules(role: &Value, secrets: bool) -> Result<()> {
    let rules = &role["rules"];
    no_wildcards(role)?;
    // patch: `suspend: true` by suspendAfterConsecutiveFailures, the one spec write.
    ensure!(verbs(rules, "singleton.dev", "singletonjobs") == ["get", "list", "patch", "watch"]);
    ensure!(verbs(rules, "singleton.dev", "singletoncalendars") == ["get", "list", "watch"]);
    ensure!(verbs(rules, "singleton.dev", "singletonjobs/status") == ["get", "patch", "update"]);
    ensure!(
        verbs(rules, "batch", "jobs") == ["create", "delete", "get", "list", "patch", "watch"],
        "jobs: {:?}",
        verbs(rules, "batch", "jobs")
    );
    ensure!(verbs(rules, "events.k8s.io", "events") == ["create", "patch"]);
    ensure!(verbs(rules, "", "events") == ["create", "patch"]);
    let want: &[&str] = if secrets { &["get"] } else { &[] };
    ensure!(
        verbs(rules, "", "secrets") == want,
        "secrets: {:?}",
        verbs(rules, "", "secrets")
    );
    ensure!(
        verbs(rules, "coordination.k8s.io", "leases").is_empty(),
        "Lease access belongs in the release namespace's Role only"
    );
    Ok(())
}

/// The Lease Role: only in the release namespace, only the release's Lease for reads and writes.
fn check_lease_role(docs: &[Value]) -> Result<()> {
    let role = one(docs, "Role", &format!("{FULLNAME}-leader-election"))?;
    ensure!(role["metadata"]["namespace"].as_str() == Some(NS));
    no_wildcards(role)?;
    for r in role["rules"].as_sequence().context("rules")? {
        // Besides the Lease: Events about it (leader changes), create and patch only.
        if strs(&r["resources"]) == ["events"] {
            ensure!(strs(&r["apiGroups"]) == ["events.k8s.io", ""], "{r:?}");
            ensure!(strs(&r["verbs"]) == ["create", "patch"], "{r:?}");
            continue;
        }
        ensure!(strs(&r["apiGroups"]) == ["coordination.k8s.io"]);
        ensure!(strs(&r["resources"]) == ["leases"]);
        let v = strs(&r["verbs"]);
        if v != ["create"] {
            ensure!(
                strs(&r["resourceNames"]) == [RELEASE],
                "Lease rule not limited to the release's Lease: {r:?}"
            );
        }
    }
    let binding = one(docs, "RoleBinding", &format!("{FULLNAME}-leader-election"))?;
    ensure!(binding["metadata"]["namespace"].as_str() == Some(NS));
    Ok(())
}

/// Numbers compared as f64 (`toYaml` writes 100 where the generator wrote 100.0).
fn normalize(v: &Value) -> Value {
    match v {
        Value::Number(n) => Value::Number(n.as_f64().unwrap_or_default().into()),
        Value::Sequence(s) => Value::Sequence(s.iter().map(normalize).collect()),
        Value::Mapping(m) => Value::Mapping(
            m.iter()
                .map(|(k, v)| (normalize(k), normalize(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[test]
fn defaults_render_a_restricted_two_replica_deployment_with_leader_election() -> Result<()> {
    let docs = render(&[])?;
    let d = one(&docs, "Deployment", FULLNAME)?;
    ensure!(
        d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"].as_i64() == Some(0),
        "a rolling update keeps a standby: {:?}",
        d["spec"]["strategy"]
    );
    ensure!(
        d["spec"]["replicas"].as_i64() == Some(2),
        "replicas: {:?}",
        d["spec"]["replicas"]
    );
    let pod = &d["spec"]["template"]["spec"];
    ensure!(pod["serviceAccountName"].as_str() == Some(FULLNAME));
    ensure!(pod["securityContext"]["runAsNonRoot"].as_bool() == Some(true));
    ensure!(pod["securityContext"]["seccompProfile"]["type"].as_str() == Some("RuntimeDefault"));
    ensure!(
        pod["topologySpreadConstraints"]
            .as_sequence()
            .is_some_and(|s| s
                .iter()
                .any(|c| c["topologyKey"].as_str() == Some("kubernetes.io/hostname"))),
        "topology spread across nodes"
    );

    let c = container(&docs)?;
    let sc = &c["securityContext"];
    ensure!(
        sc["runAsNonRoot"].as_bool() == Some(true),
        "runAsNonRoot: {sc:?}"
    );
    ensure!(sc["readOnlyRootFilesystem"].as_bool() == Some(true));
    ensure!(sc["allowPrivilegeEscalation"].as_bool() == Some(false));
    ensure!(strs(&sc["capabilities"]["drop"]) == ["ALL"]);
    ensure!(sc["seccompProfile"]["type"].as_str() == Some("RuntimeDefault"));
    ensure!(c["resources"]["requests"]["cpu"].is_string());
    ensure!(c["resources"]["requests"]["memory"].is_string());
    ensure!(
        c["image"].as_str() == Some("singleton-controller:0.1.0"),
        "image: {:?}",
        c["image"]
    );

    // Probes on the health port, by name.
    let port = &c["ports"][0];
    ensure!(
        port["name"].as_str() == Some("health") && port["containerPort"].as_i64() == Some(8080)
    );
    ensure!(c["livenessProbe"]["httpGet"]["path"].as_str() == Some("/healthz"));
    ensure!(c["livenessProbe"]["httpGet"]["port"].as_str() == Some("health"));
    ensure!(c["readinessProbe"]["httpGet"]["path"].as_str() == Some("/readyz"));
    ensure!(c["readinessProbe"]["httpGet"]["port"].as_str() == Some("health"));

    // Leader election on, the Lease named after the release, all namespaces watched.
    let a = args(&docs)?;
    ensure!(
        a.contains(&"--leader-elect=true".to_string()),
        "args: {a:?}"
    );
    ensure!(
        a.contains(&format!("--lease-name={RELEASE}")),
        "args: {a:?}"
    );
    ensure!(
        !a.iter().any(|x| x.starts_with("--namespace")),
        "args: {a:?}"
    );
    // POD_NAME / POD_NAMESPACE from the downward API (--instance and --lease-namespace).
    let env = c["env"].as_sequence().context("env")?;
    for (name, path) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let e = env
            .iter()
            .find(|e| e["name"].as_str() == Some(name))
            .with_context(|| format!("no {name}"))?;
        ensure!(
            e["valueFrom"]["fieldRef"]["fieldPath"].as_str() == Some(path),
            "{name}: {e:?}"
        );
    }

    // Every namespaced object lands in the release namespace.
    for doc in &docs {
        if let Some(ns) = doc["metadata"]["namespace"].as_str() {
            ensure!(ns == NS, "{} {} in {ns}", kind_of(doc), name_of(doc));
        }
    }

    // PDB, metrics Service; no ServiceMonitor by default.
    let pdb = one(&docs, "PodDisruptionBudget", FULLNAME)?;
    ensure!(pdb["spec"]["maxUnavailable"].as_i64() == Some(1));
    let svc = one(&docs, "Service", &format!("{FULLNAME}-metrics"))?;
    let port = &svc["spec"]["ports"][0];
    ensure!(
        port["name"].as_str() == Some("metrics") && port["targetPort"].as_str() == Some("health")
    );
    ensure!(all(&docs, "ServiceMonitor").is_empty());
    Ok(())
}

#[test]
fn defaults_render_cluster_rbac_and_a_namespaced_lease_role() -> Result<()> {
    let docs = render(&[])?;
    let cr = one(&docs, "ClusterRole", FULLNAME)?;
    check_work_rules(cr, true)?;
    let crb = one(&docs, "ClusterRoleBinding", FULLNAME)?;
    ensure!(crb["roleRef"]["name"].as_str() == Some(FULLNAME));
    ensure!(crb["subjects"][0]["name"].as_str() == Some(FULLNAME));
    ensure!(crb["subjects"][0]["namespace"].as_str() == Some(NS));
    // The only Role is the Lease's.
    let roles: Vec<&str> = all(&docs, "Role").into_iter().map(name_of).collect();
    ensure!(
        roles == [format!("{FULLNAME}-leader-election")],
        "roles: {roles:?}"
    );
    check_lease_role(&docs)?;
    ensure!(one(&docs, "ServiceAccount", FULLNAME)?["metadata"]["namespace"].as_str() == Some(NS));
    Ok(())
}

#[test]
fn watch_namespaces_renders_roles_and_no_cluster_role() -> Result<()> {
    let docs = render(&["watchNamespaces={team-a}"])?;
    ensure!(
        all(&docs, "ClusterRole").is_empty(),
        "a ClusterRole with watchNamespaces"
    );
    ensure!(all(&docs, "ClusterRoleBinding").is_empty());
    let role = docs
        .iter()
        .find(|d| kind_of(d) == "Role" && name_of(d) == FULLNAME)
        .context("no Role")?;
    ensure!(role["metadata"]["namespace"].as_str() == Some("team-a"));
    check_work_rules(role, true)?;
    let rb = docs
        .iter()
        .find(|d| kind_of(d) == "RoleBinding" && name_of(d) == FULLNAME)
        .context("no RoleBinding")?;
    ensure!(rb["metadata"]["namespace"].as_str() == Some("team-a"));
    ensure!(rb["roleRef"]["kind"].as_str() == Some("Role"));
    ensure!(rb["subjects"][0]["namespace"].as_str() == Some(NS));
    // The Lease stays in the release namespace.
    check_lease_role(&docs)?;
    let a = args(&docs)?;
    ensure!(a.contains(&"--namespace=team-a".to_string()), "args: {a:?}");
    Ok(())
}

#[test]
fn user_roles_aggregate_into_view_and_edit_only_when_asked() -> Result<()> {
    let view_name = format!("{FULLNAME}-view");
    let edit_name = format!("{FULLNAME}-edit");
    let docs = render(&[])?;
    ensure!(
        one(&docs, "ClusterRole", &view_name).is_err()
            && one(&docs, "ClusterRole", &edit_name).is_err(),
        "user roles rendered without rbac.userRoles"
    );
    let docs = render(&["rbac.userRoles=true"])?;
    let view = one(&docs, "ClusterRole", &view_name)?;
    let edit = one(&docs, "ClusterRole", &edit_name)?;
    let label = |r: &Value, l: &str| r["metadata"]["labels"][l].as_str() == Some("true");
    let agg = "rbac.authorization.k8s.io/aggregate-to-";
    ensure!(
        ["view", "edit", "admin"]
            .iter()
            .all(|k| label(view, &format!("{agg}{k}")))
    );
    ensure!(label(edit, &format!("{agg}edit")) && label(edit, &format!("{agg}admin")));
    ensure!(
        !label(edit, &format!("{agg}view")),
        "view must not get write verbs"
    );
    for (role, verbs) in [
        (view, vec!["get", "list", "watch"]),
        (
            edit,
            vec!["create", "update", "patch", "delete", "deletecollection"],
        ),
    ] {
        let rules = role["rules"].as_sequence().context("rules")?;
        ensure!(rules.len() == 1, "{rules:?}");
        ensure!(
            strs(&rules[0]["resources"]) == ["singletonjobs", "singletoncalendars"],
            "{rules:?}"
        );
        ensure!(strs(&rules[0]["verbs"]) == verbs, "{rules:?}");
    }
    Ok(())
}

#[test]
fn more_than_one_watch_namespace_is_refused() -> Result<()> {
    // By values.schema.json ...
    let err = render_err(&["watchNamespaces={a,b}"])?;
    ensure!(err.contains("watchNamespaces"), "{err}");
    // ... and by the template, when schema validation is skipped.
    let err = render_err(&["--skip-schema-validation", "watchNamespaces={a,b}"])?;
    ensure!(err.contains("one namespace"), "{err}");
    Ok(())
}

#[test]
fn unsafe_or_invalid_values_are_refused() -> Result<()> {
    let err = render_err(&["leaderElection.enabled=false"])?;
    ensure!(err.contains("leaderElection.enabled"), "{err}");
    let err = render_err(&["leaderElection.renewDeadlineSeconds=20"])?;
    ensure!(err.contains("renewDeadlineSeconds"), "{err}");
    let err = render_err(&["replicas=3"])?;
    ensure!(err.contains("replicas"), "unknown key accepted: {err}");
    // One replica without leader election is allowed (single-replica mode).
    let docs = render(&["leaderElection.enabled=false", "replicaCount=1"])?;
    ensure!(args(&docs)?.contains(&"--leader-elect=false".to_string()));
    let d = one(&docs, "Deployment", FULLNAME)?;
    ensure!(
        d["spec"]["strategy"]["type"].as_str() == Some("Recreate"),
        "without leader election an update must never run two replicas: {:?}",
        d["spec"]["strategy"]
    );
    ensure!(
        all(&docs, "PodDisruptionBudget").is_empty(),
        "a PDB for one replica"
    );
    ensure!(
        !all(&docs, "Role")
            .iter()
            .any(|r| name_of(r).ends_with("-leader-election")),
        "a Lease Role without leader election"
    );
    Ok(())
}

#[test]
fn crd_is_the_generated_one_kept_on_uninstall_and_can_be_turned_off() -> Result<()> {
    let docs = render(&[])?;
    for (name, file) in [
        ("singletonjobs.singleton.dev", "crds/singletonjob.yaml"),
        (
            "singletoncalendars.singleton.dev",
            "crds/singletoncalendar.yaml",
        ),
    ] {
        let crd = one(&docs, "CustomResourceDefinition", name)?;
        ensure!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"].as_str() == Some("keep"),
            "keep annotation: {:?}",
            crd["metadata"]
        );
        // The same schema as the file in crds/, the generated source of truth.
        let generated: Value = serde_yaml::from_str(&std::fs::read_to_string(repo_file(file))?)?;
        if normalize(&crd["spec"]) != normalize(&generated["spec"]) {
            bail!(
                "the chart's {name} differs from {file}: run `make crds` (it copies it into charts/singleton-controller/files/)"
            );
        }
    }

    let docs = render(&["crds.keep=false"])?;
    let crd = one(
        &docs,
        "CustomResourceDefinition",
        "singletonjobs.singleton.dev",
    )?;
    ensure!(crd["metadata"]["annotations"]["helm.sh/resource-policy"].is_null());

    let docs = render(&["crds.install=false"])?;
    ensure!(
        all(&docs, "CustomResourceDefinition").is_empty(),
        "CRD rendered with crds.install=false"
    );
    Ok(())
}

#[test]
fn service_monitor_and_secret_access_are_toggles() -> Result<()> {
    let docs = render(&[
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=prom",
    ])?;
    let sm = one(&docs, "ServiceMonitor", FULLNAME)?;
    ensure!(sm["metadata"]["labels"]["release"].as_str() == Some("prom"));
    let ep = &sm["spec"]["endpoints"][0];
    ensure!(ep["port"].as_str() == Some("metrics") && ep["path"].as_str() == Some("/metrics"));
    ensure!(
        sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"].as_str()
            == Some("metrics")
    );

    let docs = render(&["rbac.backstopSecrets=false"])?;
    check_work_rules(one(&docs, "ClusterRole", FULLNAME)?, false)?;
    let docs = render(&["rbac.backstopSecrets=false", "watchNamespaces={team-a}"])?;
    check_work_rules(one(&docs, "Role", FULLNAME)?, false)?;
    Ok(())
}

#[test]
fn notes_tell_the_next_command() -> Result<()> {
    let out = run_ok(helm().args(["install", RELEASE]).arg(chart_dir()).args([
        "--namespace",
        NS,
        "--dry-run=client",
    ]))?;
    let notes = out.split("NOTES:").nth(1).context("no NOTES")?;
    ensure!(
        notes.contains("kubectl apply -f examples/hello.yaml"),
        "{notes}"
    );
    ensure!(notes.contains("kubectl get sj"), "{notes}");
    ensure!(notes.contains(&format!("get lease {RELEASE}")), "{notes}");
    Ok(())
}

#[test]
fn alerts_and_dashboard_render_only_when_enabled() -> Result<()> {
    let off = render(&[])?;
    ensure!(
        all(&off, "PrometheusRule").is_empty(),
        "no PrometheusRule by default"
    );
    let on = render(&[
        "metrics.prometheusRule.enabled=true",
        "metrics.grafanaDashboard.enabled=true",
    ])?;
    let rule = all(&on, "PrometheusRule");
    ensure!(rule.len() == 1, "one PrometheusRule");
    let rules = rule[0]["spec"]["groups"][0]["rules"]
        .as_sequence()
        .map_or(0, |r| r.len());
    ensure!(rules >= 6, "{rules} alert rules");
    // Prometheus' own templating reaches Prometheus untouched by Helm.
    let text = serde_yaml::to_string(rule[0])?;
    ensure!(
        text.contains("{{ $labels.namespace }}"),
        "alert annotations keep $labels"
    );
    let dash = all(&on, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["labels"]["grafana_dashboard"].as_str() == Some("1"))
        .context("a dashboard ConfigMap labelled for Grafana's sidecar")?;
    let json = dash["data"]["singleton-controller.json"]
        .as_str()
        .unwrap_or_default();
    let parsed: serde_json::Value = serde_json::from_str(json)?;
    ensure!(
        parsed["panels"].as_array().is_some_and(|p| p.len() >= 10),
        "dashboard panels"
    );
    Ok(())
}

#[test]
fn backstop_allowed_hosts_become_one_flag_and_are_off_by_default() -> Result<()> {
    let defaults = args(&render(&[])?)?;
    ensure!(
        !defaults
            .iter()
            .any(|a| a.starts_with("--backstop-allowed-hosts")),
        "no allow-list by default: {defaults:?}"
    );
    let set = args(&render(&[
        "controller.backstopAllowedHosts={10.0.0.0/8,pg.db.svc.cluster.local}",
    ])?)?;
    ensure!(
        set.contains(&"--backstop-allowed-hosts=10.0.0.0/8,pg.db.svc.cluster.local".to_string()),
        "{set:?}"
    );
    let err = render_err(&["controller.backstopAllowedHosts={10.0.0.0/8 --evil}"])?;
    ensure!(err.contains("backstopAllowedHosts"), "{err}");
    Ok(())
}
