//! `kubectl explain singletonjob.spec...` against the real API server prints, for every field of
//! the installed CRD, the description written as a doc comment on the Rust type.

use anyhow::{Result, bail};
use e2e::{kubectl, run_ok};
use serde_json::Value;

/// Collapses whitespace, so text wrapped by kubectl compares equal to the schema's.
fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Every object in the schema that has fields, by its dotted path, with its fields' descriptions.
fn objects(node: &Value, path: &str, out: &mut Vec<(String, Vec<(String, String)>)>) {
    let node = node.get("items").unwrap_or(node);
    let Some(props) = node.get("properties").and_then(Value::as_object) else {
        return;
    };
    let fields = props
        .iter()
        .map(|(name, child)| {
            let text = child
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("");
            (name.clone(), words(text))
        })
        .collect();
    out.push((path.to_string(), fields));
    for (name, child) in props {
        objects(child, &format!("{path}.{name}"), out);
    }
}

#[tokio::test]
async fn explain_describes_every_field() -> Result<()> {
    let crd = serde_json::to_value(singleton::api::crd())?;
    let mut all = Vec::new();
    objects(
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
        "singletonjobs",
        &mut all,
    );
    // metadata is the API server's ObjectMeta, not ours.
    all.retain(|(path, _)| !path.starts_with("singletonjobs.metadata"));
    if all.len() < 5 {
        bail!("the schema walk found only {} objects: {all:?}", all.len());
    }
    let mut checked = 0;
    for (path, fields) in &all {
        let out = run_ok(kubectl().args(["explain", path.as_str()]))?;
        let shown = words(&out);
        for (name, description) in fields {
            if name == "metadata" {
                continue;
            }
            // The first sentence, or the first 60 characters of a long one, is enough to tell
            // the doc comment reached `explain`.
            let head: String = description
                .split(". ")
                .next()
                .unwrap_or("")
                .chars()
                .take(60)
                .collect();
            if head.is_empty() || !shown.contains(&head) {
                bail!(
                    "kubectl explain {path}: field {name} lacks its description {head:?}:\n{out}"
                );
            }
            checked += 1;
        }
    }
    println!(
        "kubectl explain showed the descriptions of {checked} fields in {} objects",
        all.len()
    );
    Ok(())
}

/// What the API server serves is what `kubectl explain` wraps: no description of the installed
/// CRD breaks a sentence across lines (its doc comments' source lines are joined by crdgen).
#[tokio::test]
async fn installed_descriptions_keep_whole_sentences() -> Result<()> {
    let out = run_ok(kubectl().args(["get", "crd", "singletonjobs.singleton.dev", "-o", "json"]))?;
    let crd: Value = serde_json::from_str(&out)?;
    let texts = singleton::api::descriptions(&crd["spec"]);
    if texts.len() < 20 {
        bail!("the installed CRD has only {} descriptions", texts.len());
    }
    let broken: Vec<String> = texts
        .iter()
        .flat_map(|t| singleton::api::broken_sentences(t))
        .collect();
    if !broken.is_empty() {
        bail!(
            "descriptions with a line break inside a paragraph (run `make crds` and apply crds/):\n{}",
            broken.join("\n")
        );
    }
    Ok(())
}
