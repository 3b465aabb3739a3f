//! `kubectl explain singletonjob.<field>` shows the CRD's OpenAPI descriptions, which come from the
//! doc comments on the Rust types: every field must have one, or `explain` prints an empty line.

use kube::CustomResourceExt;
use serde_json::Value;

/// Paths (`spec.backstop.postgres.table`, ...) of the schema's properties without a description.
fn undescribed(node: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            let p = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            let text = child
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("");
            if text.trim().is_empty() {
                out.push(p.clone());
            }
            undescribed(child, &p, out);
        }
    }
    if let Some(items) = node.get("items") {
        undescribed(items, path, out);
    }
}

#[test]
fn every_field_has_a_description_for_kubectl_explain() {
    let crd = serde_json::to_value(singleton::api::SingletonJob::crd()).expect("crd as json");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut missing = Vec::new();
    undescribed(schema, "", &mut missing);
    // The walk must have seen the schema, or an empty result proves nothing.
    assert!(
        schema["properties"]["spec"]["properties"]
            .as_object()
            .is_some_and(|p| p.len() > 5)
    );
    assert!(
        missing.is_empty(),
        "fields without a description: {missing:?}"
    );
}

#[test]
fn the_check_sees_a_missing_description() {
    let schema = serde_json::json!({"properties": {"spec": {"description": "d", "properties": {
        "a": {"description": "x"}, "b": {"type": "string"},
        "c": {"type": "array", "items": {"properties": {"d": {"type": "string"}}}}}}}});
    let mut missing = Vec::new();
    undescribed(&schema, "", &mut missing);
    assert_eq!(missing, ["spec.b", "spec.c", "spec.c.d"]);
}
