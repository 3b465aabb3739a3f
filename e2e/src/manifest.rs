//! The SingletonJob YAML most tests apply.

/// The Job template used by most tests: one container, completed by the fake node.
pub fn sj_yaml(name: &str, schedule: &str, extra_spec: &str) -> String {
    format!(
        r#"apiVersion: singleton.dev/v1alpha1
kind: SingletonJob
metadata:
  name: {name}
spec:
  schedule: "{schedule}"
{extra_spec}
  jobTemplate:
    spec:
      backoffLimit: 0
      template:
        spec:
          restartPolicy: Never
          containers:
          - name: work
            image: busybox
            command: ["sh", "-c", "echo $SINGLETON_FENCING_TOKEN"]
"#
    )
}

/// A SingletonJob YAML from [`sj_yaml`] whose Jobs never get a node, so its runs stay active.
pub fn never_scheduled(yaml: String) -> String {
    yaml.replace(
        "          restartPolicy: Never\n",
        "          restartPolicy: Never\n          nodeSelector:\n            singleton.dev/no-such-node: \"true\"\n",
    )
}
