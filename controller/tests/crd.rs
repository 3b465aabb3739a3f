//! `kubectl explain singletonjob.<field>` shows the CRD's OpenAPI descriptions, which come from the
//! doc comments on the Rust types: every field must have one, or `explain` prints an empty line.

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
    let crd = serde_json::to_value(singleton::api::crd()).expect("crd as json");
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

#[test]
fn descriptions_keep_whole_sentences_on_one_line() {
    let crd = serde_json::to_value(singleton::api::crd()).expect("crd as json");
    let all = singleton::api::descriptions(&crd);
    assert!(all.len() > 20, "the walk found {} descriptions", all.len());
    let broken: Vec<String> = all
        .iter()
        .flat_map(|d| singleton::api::broken_sentences(d))
        .collect();
    assert!(
        broken.is_empty(),
        "descriptions with a line break inside a paragraph:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_check_sees_a_sentence_cut_in_two_and_reflow_mends_it() {
    let doc = "Runs a Job at most once per period, and hands\nevery run a fencing token.\n\nLists:\n- one\n- two, which\n  goes on\n\n    code stays";
    assert_eq!(
        singleton::api::broken_sentences(doc).len(),
        2,
        "{:?}",
        singleton::api::broken_sentences(doc)
    );
    let mended = singleton::api::reflow(doc);
    assert_eq!(
        mended,
        "Runs a Job at most once per period, and hands every run a fencing token.\n\nLists:\n- one\n- two, which goes on\n\n    code stays"
    );
    assert!(
        singleton::api::broken_sentences(&mended).is_empty(),
        "{mended}"
    );
}

/// The formats of every property: the API server warns about any it does not know (schemars
/// writes `uint32` and `uint64` for Rust's unsigned integers).
fn formats(node: &Value, path: &str, out: &mut Vec<(String, String)>) {
    if let Some(f) = node.get("format").and_then(Value::as_str) {
        out.push((path.to_string(), f.to_string()));
    }
    for (name, child) in node
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        formats(child, &format!("{path}.{name}"), out);
    }
    if let Some(items) = node.get("items") {
        formats(items, path, out);
    }
}

#[test]
fn every_format_is_one_the_api_server_knows() {
    // OpenAPI's and Kubernetes' own formats (k8s.io/kube-openapi's format registry).
    let known = [
        "int32",
        "int64",
        "date-time",
        "byte",
        "double",
        "float",
        "date",
        "duration",
    ];
    let crd = serde_json::to_value(singleton::api::crd()).expect("crd as json");
    let mut all = Vec::new();
    formats(
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
        "",
        &mut all,
    );
    assert!(
        all.iter().any(|(_, f)| f == "int64"),
        "the walk saw the schema"
    );
    let unknown: Vec<_> = all
        .iter()
        .filter(|(_, f)| !known.contains(&f.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "formats the API server warns about: {unknown:?}"
    );
}
