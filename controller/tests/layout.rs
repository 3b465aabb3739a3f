//! The layout rules of docs/architecture.md, checked on the source: the modules declared in
//! `lib.rs` are in the order of the flow, and each imports only modules declared before it (so
//! there is no cycle between them; test modules may import anything); no function in the
//! workspace, tests and the e2e and bench crates included, is over 80 lines unless a comment says
//! why it must be one piece ("One piece: ...").
//!
//! Both read every line of a file through `code_only`, which blanks comments and literals: an
//! earlier version stopped at a file's first `#[cfg(test)]`, which in `backstop/mod.rs` was a
//! `mod tests;` on line 39, and so never saw the 164-line claim transaction below it.

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
    rust_files(&Path::new(SRC).join(m))
}

/// The code of a file: comments and literals blanked (`code_only`), and the items marked
/// `#[cfg(test)]` too (a `mod tests;` line, or an item to its closing brace). Same lines.
fn code(path: &Path) -> String {
    let text = code_only(&std::fs::read_to_string(path).unwrap());
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let item = &rest[i..];
        let semi = item.find(';').unwrap_or(item.len());
        let open = item.find('{').unwrap_or(item.len());
        let end = if semi < open {
            semi + 1
        } else {
            matching_brace(item, open).map_or(item.len(), |e| e + 1)
        };
        out.extend(
            item[..end]
                .chars()
                .map(|c| if c == '\n' { '\n' } else { ' ' }),
        );
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// The byte offset of the `}` closing the `{` at `open` in `code` (comments and literals blanked).
fn matching_brace(code: &str, open: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (k, b) in code.bytes().enumerate().skip(open) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// `text` with comments, string and character literals blanked out (same lines, same length),
/// so that braces inside them do not count.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if c[i] == 'r' && matches!(next, Some('"' | '#')) && raw_prefix(&c, i) {
            // A raw string: r"..." or r#"..."# (any number of #).
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let close: Vec<char> = close.chars().collect();
            let mut k = j + 1;
            while k < c.len() && c[k..].iter().take(close.len()).ne(close.iter()) {
                k += 1;
            }
            let end = (k + close.len()).min(c.len());
            for &ch in &c[i..end] {
                blank(&mut out, ch);
            }
            i = end;
        } else if c[i] == '"' {
            blank(&mut out, c[i]);
            i += 1;
            while i < c.len() && c[i] != '"' {
                let n = if c[i] == '\\' { 2 } else { 1 };
                for &ch in c.iter().skip(i).take(n) {
                    blank(&mut out, ch);
                }
                i += n;
            }
            if i < c.len() {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\u{7f}'), or a lifetime ('a), which is kept.
            let len = if next == Some('\\') {
                c[i + 2..].iter().position(|&ch| ch == '\'').map(|p| p + 3)
            } else if c.get(i + 2) == Some(&'\'') {
                Some(3)
            } else {
                None
            };
            match len {
                Some(n) => {
                    for &ch in c.iter().skip(i).take(n) {
                        blank(&mut out, ch);
                    }
                    i += n;
                }
                None => {
                    out.push(c[i]);
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Whether the `r` at `i` begins a raw string (`r"`, `br"`), not an identifier's last letter.
fn raw_prefix(c: &[char], i: usize) -> bool {
    let ident = |k: Option<usize>| {
        k.and_then(|k| c.get(k))
            .is_some_and(|c| c.is_alphanumeric() || *c == '_')
    };
    !ident(i.checked_sub(1)) || (c[i - 1] == 'b' && !ident(i.checked_sub(2)))
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

/// Whether a line (trimmed) starts a function: `fn`, after any of `pub`, `pub(...)`, `const`,
/// `async`, `unsafe`.
fn starts_fn(line: &str) -> bool {
    let mut l = line.trim_start();
    loop {
        if let Some(r) = l.strip_prefix("pub(") {
            l = r.split_once(") ").map_or("", |(_, r)| r);
        } else if let Some(r) = ["pub ", "const ", "async ", "unsafe "]
            .iter()
            .find_map(|p| l.strip_prefix(p))
        {
            l = r;
        } else {
            return l.starts_with("fn ");
        }
    }
}

/// Functions outside test items over `limit` lines whose comments do not say why they are one
/// piece.
fn long_functions(path: &Path, limit: usize) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let code = code(path);
    let lines: Vec<&str> = text.lines().collect();
    let code_lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < code_lines.len() {
        let l = code_lines[i].trim_end();
        if !starts_fn(l) || l.ends_with(';') {
            i += 1;
            continue;
        }
        // The body: from the first `{` to its match (a declaration without one ends at `;`).
        let mut depth = 0i32;
        let mut opened = false;
        let mut end = i;
        'lines: for (k, line) in code_lines.iter().enumerate().skip(i) {
            for c in line.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    ';' if !opened => break 'lines,
                    _ => {}
                }
            }
            end = k;
            if opened && depth == 0 {
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

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
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
    out.sort();
    out
}

/// Every library and binary source of the workspace: the controller, the e2e crate's harness (its
/// chaos checker, worlds and helpers) and the bench. Test code is not held to the rule: the test
/// binaries under `tests/`, the `tests.rs` files that `#[cfg(test)] mod tests;` names, and the
/// `#[cfg(test)]` items of other files; a test scenario reads as one story, and what it calls
/// is harness code, which is.
#[test]
fn no_function_is_over_80_lines_without_saying_why() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files: Vec<PathBuf> = ["controller/src", "e2e/src", "bench/src"]
        .iter()
        .flat_map(|d| rust_files(&root.join(d)))
        .filter(|p| p.file_name().is_none_or(|n| n != "tests.rs"))
        .collect();
    assert!(
        files.len() > 100,
        "the workspace's sources: {}",
        files.len()
    );
    let long: Vec<String> = files.iter().flat_map(|p| long_functions(p, 80)).collect();
    assert!(
        long.is_empty(),
        "functions over 80 lines without a comment saying why they are one piece (\"One piece: ...\"):\n{}",
        long.join("\n")
    );
}

/// The scanner itself: braces in strings, characters and comments do not count; a function
/// after a `#[cfg(test)] mod tests;` line is seen, one inside a `#[cfg(test)]` module is not; a
/// long one is found, a short one or one that says why is not.
#[test]
fn the_scanner_sees_every_line_and_skips_literals() {
    let dir = std::env::temp_dir().join(format!("layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let body = |n: usize| "    let _ = 1;\n".repeat(n);
    let text = format!(
        "#[cfg(test)]\nmod tests;\n\nfn short() {{\n{}}}\n\n\
         pub(crate) async fn long() {{\n    let _ = \"}}\"; let _ = '}}'; let _ = r#\"}}\"#; // }}\n{}}}\n\n\
         // One piece: said why.\nfn excused() {{\n{}}}\n\nfn after<'a>(x: &'a str) -> &'a str {{\n{}    x\n}}\n\
         #[cfg(test)]\nmod more {{\n    fn long_test() {{\n{}    }}\n}}\n",
        body(10),
        body(85),
        body(90),
        body(81),
        body(90)
    );
    let path = dir.join("sample.rs");
    std::fs::write(&path, text).unwrap();
    let found = long_functions(&path, 80);
    std::fs::remove_dir_all(&dir).unwrap();
    let lines: Vec<&str> = found
        .iter()
        .map(|f| f.rsplit_once(':').unwrap().1)
        .collect();
    assert_eq!(lines, ["17 (88 lines)", "200 (84 lines)"], "{found:?}");
}
