//! The layout rules of docs/architecture.md, checked on the source: the modules declared in
//! `lib.rs` are in the order of the flow, and each imports only modules declared before it (so
//! there is no cycle between them); no function outside tests is over 80 lines unless a comment
//! says why it must be one piece ("One piece: ...").

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// The top-level modules of the crate, in the order `lib.rs` declares them.
fn modules() -> Vec<String> {
    let lib = std::fs::read_to_string(Path::new(SRC).join("lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect()
}

/// The files of module `m`: `m.rs`, or everything under `m/`.
fn files(m: &str) -> Vec<PathBuf> {
    let file = Path::new(SRC).join(format!("{m}.rs"));
    if file.exists() {
        return vec![file];
    }
    let mut out = Vec::new();
    let mut dirs = vec![Path::new(SRC).join(m)];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out
}

/// The code of a file without its test module (`#[cfg(test)]` to the end, by convention) and
/// without comments.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("\n#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The crate's top-level modules that `code` names (`crate::x`, `use crate::{x, y::z}`).
fn referenced(code: &str, known: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if known.contains(&name) {
                    out.insert(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if known.contains(&name) {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn modules_import_only_modules_declared_before_them() {
    let order = modules();
    assert!(order.len() > 10, "lib.rs declares the modules: {order:?}");
    let mut wrong = Vec::new();
    for (i, m) in order.iter().enumerate() {
        for f in files(m) {
            for used in referenced(&code(&f), &order) {
                let j = order.iter().position(|o| *o == used).unwrap();
                if j > i {
                    wrong.push(format!("{} uses {used}", f.display()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a module imports one declared after it in lib.rs (the flow's order):\n{}",
        wrong.join("\n")
    );
}

/// Functions (outside test modules) over `limit` lines whose comments do not say why they are
/// one piece.
fn long_functions(path: &Path, limit: usize) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("\n#[cfg(test)]").next().unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim_start();
        let is_fn = [
            "fn ",
            "pub fn ",
            "async fn ",
            "pub async fn ",
            "pub(crate) fn ",
        ]
        .iter()
        .chain(&[
            "pub(super) fn ",
            "pub(crate) async fn ",
            "pub(super) async fn ",
        ])
        .any(|p| l.starts_with(p));
        if !is_fn || l.ends_with(';') {
            i += 1;
            continue;
        }
        // The body: from the first `{` to its match.
        let mut depth = 0i32;
        let mut opened = false;
        let mut end = i;
        for (k, line) in lines.iter().enumerate().skip(i) {
            for c in line.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if opened && depth == 0 {
                end = k;
                break;
            }
        }
        let len = end - i + 1;
        let comments = lines[..i]
            .iter()
            .rev()
            .take_while(|l| {
                let t = l.trim_start();
                t.starts_with("//") || t.starts_with("#[")
            })
            .chain(lines[i..=end].iter())
            .any(|l| l.contains("One piece:"));
        if len > limit && !comments {
            out.push(format!("{}:{} ({len} lines)", path.display(), i + 1));
        }
        i = end + 1;
    }
    out
}

#[test]
fn no_function_is_over_80_lines_without_saying_why() {
    let mut long = Vec::new();
    let mut dirs = vec![PathBuf::from(SRC)];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs")
                && p.file_name().is_none_or(|n| n != "tests.rs")
            {
                long.extend(long_functions(&p, 80));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over 80 lines without a comment saying why they are one piece (\"One piece: ...\"):\n{}",
        long.join("\n")
    );
}
