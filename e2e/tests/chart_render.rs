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

/// The SingletonJob, SingletonJob-status, SingletonCalendar, Job and Event grants of the
/// controller, and no Secrets: those are opt-in per namespace (backstop-secrets.yaml).
fn check_work_rules(role: &Value) -> Result<()> {
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
    ensure!(
        verbs(rules, "", "secrets").is_empty(),
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
        c["image"].as_str() == Some("singleton-controller:0.3.0"),
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
    // /metrics on its own port, with token review, the address from the values.
    let port = &c["ports"][1];
    ensure!(
        port["name"].as_str() == Some("metrics") && port["containerPort"].as_i64() == Some(8443)
    );

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
    ensure!(
        a.contains(&"--metrics-auth=kubernetes".to_string())
            && !a.iter().any(|x| x.starts_with("--metrics-cert-file")),
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
        port["name"].as_str() == Some("metrics") && port["targetPort"].as_str() == Some("metrics")
    );
    ensure!(all(&docs, "ServiceMonitor").is_empty());
    Ok(())
}

#[test]
fn defaults_render_cluster_rbac_and_a_namespaced_lease_role() -> Result<()> {
    let docs = render(&[])?;
    let cr = one(&docs, "ClusterRole", FULLNAME)?;
    check_work_rules(cr)?;
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
    // No ClusterRole for the work; only the cluster-scoped reviews of /metrics callers (their
    // own test: metrics_rbac_reviews_tokens_and_offers_a_reader_role).
    let metrics_only = |kind: &str| {
        all(&docs, kind)
            .into_iter()
            .all(|d| name_of(d).starts_with(&format!("{FULLNAME}-metrics-")))
    };
    ensure!(
        metrics_only("ClusterRole") && metrics_only("ClusterRoleBinding"),
        "a ClusterRole for the work with watchNamespaces"
    );
    let docs_none = render(&["watchNamespaces={team-a}", "metrics.auth=none"])?;
    ensure!(all(&docs_none, "ClusterRole").is_empty());
    ensure!(all(&docs_none, "ClusterRoleBinding").is_empty());
    let role = docs
        .iter()
        .find(|d| kind_of(d) == "Role" && name_of(d) == FULLNAME)
        .context("no Role")?;
    ensure!(role["metadata"]["namespace"].as_str() == Some("team-a"));
    check_work_rules(role)?;
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
    // HTTPS with Prometheus's own token; the self-signed certificate is not verified.
    ensure!(ep["scheme"].as_str() == Some("https"), "{ep:?}");
    ensure!(
        ep["bearerTokenFile"].as_str()
            == Some("/var/run/secrets/kubernetes.io/serviceaccount/token")
    );
    ensure!(ep["tlsConfig"]["insecureSkipVerify"].as_bool() == Some(true));
    // A certificate from a Secret: verified with the tlsConfig given, served from the mount.
    let docs = render(&[
        "metrics.serviceMonitor.enabled=true",
        "metrics.tlsSecret=metrics-tls",
        "metrics.serviceMonitor.tlsConfig.serverName=sc-metrics.ns.svc",
        "metrics.serviceMonitor.tlsConfig.ca.secret.name=metrics-tls",
        "metrics.serviceMonitor.tlsConfig.ca.secret.key=ca.crt",
    ])?;
    let ep = &one(&docs, "ServiceMonitor", FULLNAME)?["spec"]["endpoints"][0];
    ensure!(ep["tlsConfig"]["insecureSkipVerify"].is_null(), "{ep:?}");
    ensure!(ep["tlsConfig"]["serverName"].as_str() == Some("sc-metrics.ns.svc"));
    ensure!(ep["tlsConfig"]["ca"]["secret"]["key"].as_str() == Some("ca.crt"));
    let a = args(&docs)?;
    let dir = "/etc/singleton-controller/metrics-tls";
    ensure!(
        a.contains(&format!("--metrics-cert-file={dir}/tls.crt"))
            && a.contains(&format!("--metrics-key-file={dir}/tls.key")),
        "args: {a:?}"
    );
    let c = container(&docs)?;
    ensure!(c["volumeMounts"][0]["mountPath"].as_str() == Some(dir));
    ensure!(c["volumeMounts"][0]["readOnly"].as_bool() == Some(true));
    let deploy = one(&docs, "Deployment", FULLNAME)?;
    ensure!(
        deploy["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"].as_str()
            == Some("metrics-tls")
    );
    // metrics.auth=none: plain HTTP, no bearer token.
    let docs = render(&["metrics.serviceMonitor.enabled=true", "metrics.auth=none"])?;
    let ep = &one(&docs, "ServiceMonitor", FULLNAME)?["spec"]["endpoints"][0];
    ensure!(ep["scheme"].as_str() == Some("http") && ep["bearerTokenFile"].is_null());
    ensure!(
        sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"].as_str()
            == Some("metrics")
    );

    let docs = render(&["rbac.backstopSecrets=false"])?;
    check_work_rules(one(&docs, "ClusterRole", FULLNAME)?)?;
    ensure!(
        !docs
            .iter()
            .any(|d| name_of(d).ends_with("-backstop-secrets")),
        "a backstop-secrets role with rbac.backstopSecrets=false"
    );
    let err = render_err(&["rbac.backstopSecrets=false", "rbac.backstopNamespaces={a}"])?;
    ensure!(err.contains("rbac.backstopNamespaces"), "{err}");
    let docs = render(&["rbac.backstopSecrets=false", "watchNamespaces={team-a}"])?;
    check_work_rules(one(&docs, "Role", FULLNAME)?)?;
    Ok(())
}

const SECRETS_ROLE: &str = "sc-singleton-controller-backstop-secrets";

/// The RoleBindings to the backstop-secrets role: (namespace, role kind).
fn secret_bindings(docs: &[Value]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = docs
        .iter()
        .filter(|d| {
            matches!(kind_of(d), "RoleBinding" | "ClusterRoleBinding")
                && d["roleRef"]["name"].as_str() == Some(SECRETS_ROLE)
        })
        .map(|d| {
            let ns = d["metadata"]["namespace"].as_str().unwrap_or("<cluster>");
            let kind = d["roleRef"]["kind"].as_str().unwrap_or_default();
            (ns.to_string(), kind.to_string())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn secret_access_is_bound_only_in_the_namespaces_listed() -> Result<()> {
    // Defaults: the role is shipped for namespace owners to bind, and bound nowhere.
    let docs = render(&[])?;
    let role = one(&docs, "ClusterRole", SECRETS_ROLE)?;
    no_wildcards(role)?;
    ensure!(verbs(&role["rules"], "", "secrets") == ["get"]);
    ensure!(
        role["rules"].as_sequence().map(Vec::len) == Some(1),
        "{role:?}"
    );
    ensure!(
        role["metadata"]["labels"]["singleton.dev/grants"].as_str() == Some("backstop-secrets")
    );
    ensure!(
        secret_bindings(&docs).is_empty(),
        "{:?}",
        secret_bindings(&docs)
    );
    for d in &docs {
        if kind_of(d).ends_with("Role") {
            ensure!(
                name_of(d) == SECRETS_ROLE || verbs(&d["rules"], "", "secrets").is_empty(),
                "{} {} grants Secrets",
                kind_of(d),
                name_of(d)
            );
        }
    }

    let docs = render(&["rbac.backstopNamespaces={team-a,team-b}"])?;
    let want = [("team-a", "ClusterRole"), ("team-b", "ClusterRole")];
    let got = secret_bindings(&docs);
    ensure!(
        got.iter().map(|(a, b)| (a.as_str(), b.as_str())).eq(want),
        "{got:?}"
    );
    let rb = one(&docs, "RoleBinding", SECRETS_ROLE)?;
    ensure!(rb["subjects"][0]["name"].as_str() == Some(FULLNAME));
    ensure!(rb["subjects"][0]["namespace"].as_str() == Some(NS));

    // One namespace served: a Role there, bound only if listed, and only that one may be.
    let docs = render(&["watchNamespaces={team-a}"])?;
    ensure!(one(&docs, "Role", SECRETS_ROLE)?["metadata"]["namespace"].as_str() == Some("team-a"));
    ensure!(secret_bindings(&docs).is_empty());
    let docs = render(&[
        "watchNamespaces={team-a}",
        "rbac.backstopNamespaces={team-a}",
    ])?;
    ensure!(secret_bindings(&docs) == [("team-a".to_string(), "Role".to_string())]);
    let err = render_err(&[
        "watchNamespaces={team-a}",
        "rbac.backstopNamespaces={team-b}",
    ])?;
    ensure!(err.contains("team-b is not the namespace served"), "{err}");
    let err = render_err(&["rbac.backstopNamespaces={Bad_Name}"])?;
    ensure!(err.contains("backstopNamespaces"), "{err}");
    Ok(())
}

#[test]
fn admission_policies_render_by_default_and_can_be_turned_off() -> Result<()> {
    let requester = format!("{FULLNAME}-operation-requester");
    let jobs = format!("{FULLNAME}-controller-jobs");
    let status = format!("{FULLNAME}-controller-status");
    let docs = render(&[])?;
    for name in [&requester, &jobs, &status] {
        let p = one(&docs, "ValidatingAdmissionPolicy", name)?;
        ensure!(p["apiVersion"].as_str() == Some("admissionregistration.k8s.io/v1"));
        ensure!(p["spec"]["failurePolicy"].as_str() == Some("Fail"));
        let b = one(&docs, "ValidatingAdmissionPolicyBinding", name)?;
        ensure!(b["spec"]["policyName"].as_str() == Some(name.as_str()));
        ensure!(strs(&b["spec"]["validationActions"]) == ["Deny"]);
        ensure!(
            b["spec"]["matchResources"].is_null(),
            "bound cluster-wide: {b:?}"
        );
    }
    let p = one(&docs, "ValidatingAdmissionPolicy", &jobs)?;
    let user = format!("system:serviceaccount:{NS}:{FULLNAME}");
    let cond = p["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap_or_default();
    ensure!(cond.contains(&format!("\"{user}\"")), "{cond}");
    // Only the controller writes status (N8).
    let sp = one(&docs, "ValidatingAdmissionPolicy", &status)?;
    ensure!(
        strs(&sp["spec"]["matchConstraints"]["resourceRules"][0]["resources"])
            == ["singletonjobs/status"]
    );
    let rule = sp["spec"]["validations"][0]["expression"]
        .as_str()
        .unwrap_or_default();
    ensure!(
        rule == format!("request.userInfo.username == \"{user}\""),
        "{rule}"
    );
    let ns_rule = p["spec"]["validations"][0]["expression"]
        .as_str()
        .unwrap_or_default();
    ensure!(
        ns_rule.contains(r#"["kube-system","kube-public","kube-node-lease","singleton-system"]"#),
        "{ns_rule}"
    );
    // New Jobs only in namespaces that opted in (N2): by label, unless one namespace is served
    // or the opt-in is turned off.
    let opted_in = |p: &Value| {
        p["spec"]["variables"]
            .as_sequence()
            .and_then(|v| v.iter().find(|v| v["name"] == "optedIn"))
            .and_then(|v| v["expression"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    let rule = opted_in(p);
    ensure!(
        rule.contains("namespaceObject.metadata.labels['singleton.dev/jobs'] == 'true'"),
        "{rule}"
    );
    for set in [
        "watchNamespaces={team-a}",
        "admissionPolicies.jobNamespaceOptIn=false",
    ] {
        let docs = render(&[set])?;
        let rule = opted_in(one(&docs, "ValidatingAdmissionPolicy", &jobs)?);
        ensure!(rule == "true", "{set}: {rule}");
    }

    // Serving one namespace: the requester and status policies are bound to it only.
    let docs = render(&["watchNamespaces={team-a}"])?;
    for name in [&requester, &status] {
        let b = one(&docs, "ValidatingAdmissionPolicyBinding", name)?;
        ensure!(
            b["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
                ["kubernetes.io/metadata.name"]
                .as_str()
                == Some("team-a"),
            "{b:?}"
        );
    }
    // A namespace served that is protected could run nothing: refused, unless opted in.
    let err = render_err(&[&format!("watchNamespaces={{{NS}}}")])?;
    ensure!(err.contains("is protected"), "{err}");
    let docs = render(&[
        &format!("watchNamespaces={{{NS}}}"),
        "admissionPolicies.protectReleaseNamespace=false",
    ])?;
    let p = one(&docs, "ValidatingAdmissionPolicy", &jobs)?;
    let ns_rule = p["spec"]["validations"][0]["expression"]
        .as_str()
        .unwrap_or_default();
    ensure!(!ns_rule.contains(NS), "{ns_rule}");

    let docs = render(&[
        "admissionPolicies.operationRequester=false",
        "admissionPolicies.controllerJobs=false",
        "admissionPolicies.controllerStatus=false",
    ])?;
    ensure!(all(&docs, "ValidatingAdmissionPolicy").is_empty());
    ensure!(all(&docs, "ValidatingAdmissionPolicyBinding").is_empty());
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
fn metrics_rbac_reviews_tokens_and_offers_a_reader_role() -> Result<()> {
    for sets in [&[][..], &["watchNamespaces={team-a}"][..]] {
        let docs = render(sets)?;
        let auth = one(&docs, "ClusterRole", &format!("{FULLNAME}-metrics-auth"))?;
        no_wildcards(auth)?;
        let rules = &auth["rules"];
        ensure!(verbs(rules, "authentication.k8s.io", "tokenreviews") == ["create"]);
        ensure!(verbs(rules, "authorization.k8s.io", "subjectaccessreviews") == ["create"]);
        ensure!(rules.as_sequence().map(Vec::len) == Some(2), "{rules:?}");
        let crb = one(
            &docs,
            "ClusterRoleBinding",
            &format!("{FULLNAME}-metrics-auth"),
        )?;
        ensure!(crb["roleRef"]["name"].as_str() == Some(&*format!("{FULLNAME}-metrics-auth")));
        ensure!(crb["subjects"][0]["name"].as_str() == Some(FULLNAME));
        ensure!(crb["subjects"][0]["namespace"].as_str() == Some(NS));
        // For Prometheus to be bound to; the chart binds nobody to it.
        let reader = one(&docs, "ClusterRole", &format!("{FULLNAME}-metrics-reader"))?;
        let rule = &reader["rules"][0];
        ensure!(strs(&rule["nonResourceURLs"]) == ["/metrics"] && strs(&rule["verbs"]) == ["get"]);
        ensure!(reader["rules"].as_sequence().map(Vec::len) == Some(1));
        ensure!(
            !all(&docs, "ClusterRoleBinding")
                .iter()
                .any(|b| b["roleRef"]["name"].as_str()
                    == Some(&*format!("{FULLNAME}-metrics-reader")))
        );
    }
    // No reviews without token checks; no RBAC at all without rbac.create.
    for sets in [&["metrics.auth=none"][..], &["rbac.create=false"][..]] {
        let docs = render(sets)?;
        ensure!(
            !all(&docs, "ClusterRole")
                .iter()
                .any(|r| name_of(r).contains("-metrics-")),
            "{sets:?}"
        );
    }
    let a = args(&render(&["metrics.auth=none"])?)?;
    ensure!(
        a.contains(&"--metrics-auth=none".to_string()),
        "args: {a:?}"
    );
    Ok(())
}

#[test]
fn network_policy_is_off_by_default_and_opens_only_the_ports_and_peers_named() -> Result<()> {
    ensure!(all(&render(&[])?, "NetworkPolicy").is_empty());
    // On, it needs the API server's addresses: without them the controller would be cut off.
    let err = render_err(&["networkPolicy.enabled=true"])?;
    ensure!(
        err.contains("networkPolicy.egress.apiServer.cidrs"),
        "{err}"
    );

    let docs = render(&[
        "networkPolicy.enabled=true",
        "networkPolicy.egress.apiServer.cidrs={10.0.0.1/32}",
        "networkPolicy.egress.backstop.cidrs={10.20.0.0/16,10.21.0.5/32}",
        "networkPolicy.egress.notify.cidrs={203.0.113.0/24}",
        "networkPolicy.ingress.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring",
    ])?;
    let np = one(&docs, "NetworkPolicy", FULLNAME)?;
    let spec = &np["spec"];
    ensure!(strs(&spec["policyTypes"]) == ["Ingress", "Egress"]);
    ensure!(
        spec["podSelector"]["matchLabels"]["app.kubernetes.io/instance"].as_str() == Some(RELEASE)
    );
    // Ingress: the metrics port from the named namespace, the health port (the kubelet).
    let ingress = spec["ingress"].as_sequence().context("ingress")?;
    ensure!(ingress.len() == 2, "{ingress:?}");
    ensure!(ingress[0]["ports"][0]["port"].as_str() == Some("metrics"));
    ensure!(
        ingress[0]["from"][0]["namespaceSelector"]["matchLabels"]["name"].as_str()
            == Some("monitoring")
    );
    ensure!(ingress[1]["ports"][0]["port"].as_str() == Some("health"));
    ensure!(
        ingress
            .iter()
            .all(|r| r["ports"].as_sequence().map(Vec::len) == Some(1))
    );
    // Egress: the API server by address, DNS, the backstop databases, the notifications'
    // receivers; nothing else.
    let egress = spec["egress"].as_sequence().context("egress")?;
    ensure!(egress.len() == 4, "{egress:?}");
    let cidrs = |rule: &Value| -> Vec<String> {
        rule["to"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|p| p["ipBlock"]["cidr"].as_str().map(String::from))
            .collect()
    };
    let ports = |rule: &Value| -> Vec<i64> {
        rule["ports"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|p| p["port"].as_i64())
            .collect()
    };
    ensure!(cidrs(&egress[0]) == ["10.0.0.1/32"] && ports(&egress[0]) == [443, 6443]);
    ensure!(
        egress[1]["to"][0]["podSelector"]["matchLabels"]["k8s-app"].as_str() == Some("kube-dns")
            && ports(&egress[1]) == [53, 53]
    );
    ensure!(cidrs(&egress[2]) == ["10.20.0.0/16", "10.21.0.5/32"] && ports(&egress[2]) == [5432]);
    ensure!(cidrs(&egress[3]) == ["203.0.113.0/24"] && ports(&egress[3]) == [443]);
    // No backstop or receiver addresses: no rule for them (not an open one).
    let docs = render(&[
        "networkPolicy.enabled=true",
        "networkPolicy.egress.apiServer.cidrs={10.0.0.1/32}",
    ])?;
    let egress = one(&docs, "NetworkPolicy", FULLNAME)?["spec"]["egress"]
        .as_sequence()
        .context("egress")?
        .clone();
    ensure!(
        egress.len() == 2 && egress.iter().all(|r| !r["to"].is_null()),
        "{egress:?}"
    );
    // A malformed CIDR is refused by the schema.
    let err = render_err(&[
        "networkPolicy.enabled=true",
        "networkPolicy.egress.apiServer.cidrs={kubernetes.default}",
    ])?;
    ensure!(err.contains("cidrs"), "{err}");
    Ok(())
}

#[test]
fn metrics_values_that_cannot_work_are_refused() -> Result<()> {
    let err = render_err(&["metrics.auth=basic"])?;
    ensure!(err.contains("auth"), "{err}");
    let err = render_err(&["metrics.auth=none", "metrics.tlsSecret=x"])?;
    ensure!(
        err.contains("metrics.tlsSecret needs metrics.auth=kubernetes"),
        "{err}"
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

/// The container's value of environment variable `name`, if set.
fn env_value(docs: &[Value], name: &str) -> Result<Option<String>> {
    Ok(container(docs)?["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|e| e["name"].as_str() == Some(name))
        .and_then(|e| e["value"].as_str().map(str::to_string)))
}

#[test]
fn the_prepare_lead_becomes_its_variable_30_s_by_default_and_out_of_range_is_refused() -> Result<()>
{
    let var = "SINGLETON_PREPARE_LEAD_SECONDS";
    let defaults = env_value(&render(&[])?, var)?;
    ensure!(
        defaults.as_deref() == Some("30"),
        "30 s by default: {defaults:?}"
    );
    let set = env_value(&render(&["controller.prepareLeadSeconds=0"])?, var)?;
    ensure!(set.as_deref() == Some("0"), "off: {set:?}");
    for bad in ["-1", "3601", "1.5"] {
        let err = render_err(&[&format!("controller.prepareLeadSeconds={bad}")])?;
        ensure!(err.contains("prepareLeadSeconds"), "{bad} accepted: {err}");
    }
    Ok(())
}

#[test]
fn the_prepare_max_lead_becomes_its_variable_600_by_default_and_never_below_the_lead() -> Result<()>
{
    let var = "SINGLETON_PREPARE_MAX_LEAD_SECONDS";
    let defaults = env_value(&render(&[])?, var)?;
    ensure!(defaults.as_deref() == Some("600"), "{defaults:?}");
    let set = env_value(
        &render(&[
            "controller.prepareLeadSeconds=30",
            "controller.prepareMaxLeadSeconds=30",
        ])?,
        var,
    )?;
    ensure!(set.as_deref() == Some("30"), "{set:?}");
    for bad in ["-1", "3601", "1.5"] {
        let err = render_err(&[&format!("controller.prepareMaxLeadSeconds={bad}")])?;
        ensure!(
            err.contains("prepareMaxLeadSeconds"),
            "{bad} accepted: {err}"
        );
    }
    // Below the lead the controller refuses to start: refused at render already.
    let err = render_err(&[
        "controller.prepareLeadSeconds=900",
        "controller.prepareMaxLeadSeconds=600",
    ])?;
    ensure!(
        err.contains("prepareMaxLeadSeconds (600)") && err.contains("prepareLeadSeconds (900)"),
        "{err}"
    );
    Ok(())
}

#[test]
fn default_notification_targets_become_one_flag_and_a_role_for_exactly_their_secrets() -> Result<()>
{
    let docs = render(&[])?;
    ensure!(
        !args(&docs)?
            .iter()
            .any(|a| a.starts_with("--default-notify"))
    );
    ensure!(
        all(&docs, "Role")
            .iter()
            .all(|r| !name_of(r).ends_with("-notify-secrets")),
        "no Secret grant without defaults"
    );
    let docs = render(&[
        "notify.defaults[0].name=platform",
        "notify.defaults[0].format=Slack",
        "notify.defaults[0].urlSecretRef.name=platform-slack",
        "notify.defaults[0].urlSecretRef.key=url",
        "notify.defaults[1].name=hooks",
        "notify.defaults[1].url=https://hooks.example.com/x",
        "notify.defaults[1].signingSecretRef.name=hook-key",
        "notify.defaults[1].signingSecretRef.key=k",
    ])?;
    let flag = args(&docs)?
        .into_iter()
        .find_map(|a| a.strip_prefix("--default-notify=").map(String::from))
        .context("--default-notify")?;
    let targets: Vec<singleton::api::NotifyTarget> = serde_json::from_str(&flag)?;
    ensure!(
        targets.len() == 2 && targets.iter().all(|t| t.check().is_ok()),
        "{flag}"
    );
    let role = one(&docs, "Role", &format!("{FULLNAME}-notify-secrets"))?;
    let rule = &role["rules"][0];
    ensure!(
        strs(&rule["resourceNames"]) == ["hook-key", "platform-slack"]
            && strs(&rule["verbs"]) == ["get"],
        "{rule:?}"
    );
    one(&docs, "RoleBinding", &format!("{FULLNAME}-notify-secrets"))?;
    // The schema refuses what the controller would refuse at start-up.
    let err = render_err(&[
        "notify.defaults[0].name=x",
        "notify.defaults[0].url=ftp://example.com/",
    ])?;
    ensure!(err.contains("notify"), "{err}");
    Ok(())
}
