//! The SBOMs of `make image` (issue 34, review N9): CycloneDX for each image and for the Rust
//! workspace. Checked against what the image was built from: every crate cargo links into the
//! controller's binary, at its locked version, and the Debian package (at the version installed
//! here) of every library staged beside it.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context as _, Result, ensure};
use e2e::{repo_file, run_ok};
use serde_json::Value;

fn read(path: PathBuf) -> Result<Value> {
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{}: missing; `make image` (hack/image.sh) writes it",
            path.display()
        )
    })?;
    Ok(serde_json::from_str(&text)?)
}

/// (name, version) of the components whose purl starts with `scheme`.
fn components(bom: &Value, scheme: &str) -> BTreeSet<(String, String)> {
    bom["components"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["purl"].as_str().is_some_and(|p| p.starts_with(scheme)))
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("name"), s("version"))
        })
        .collect()
}

/// Every crate cargo links into `package`'s binaries for this machine (normal dependencies).
fn linked(package: &str) -> Result<BTreeSet<(String, String)>> {
    let host = run_ok(Command::new("rustc").arg("-vV"))?
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .context("rustc -vV: no host")?;
    let out = run_ok(Command::new("cargo").current_dir(repo_file("")).args([
        "tree", "--locked", "-p", package, "-e", "normal", "--prefix", "none", "--target", &host,
        "--format", "{p}",
    ]))?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?;
            let version = words.next()?.trim_start_matches('v');
            Some((name.to_string(), version.to_string()))
        })
        .filter(|(name, _)| name != package)
        .collect())
}

/// The version of Debian package `name` installed here.
fn deb_version(name: &str) -> Result<String> {
    run_ok(Command::new("dpkg-query").args(["-W", "-f", "${Version}", name]))
}

#[test]
fn the_controller_images_sbom_names_every_crate_and_library_it_holds() -> Result<()> {
    let bom = read(repo_file(".cache/images/controller.cdx.json"))?;
    ensure!(
        bom["bomFormat"] == "CycloneDX",
        "bomFormat: {}",
        bom["bomFormat"]
    );
    ensure!(
        bom["specVersion"] == "1.5",
        "specVersion: {}",
        bom["specVersion"]
    );
    let image = &bom["metadata"]["component"];
    ensure!(
        image["type"] == "container" && image["name"] == "localhost/singleton/singleton-controller",
        "the described component is the image: {image}"
    );

    let crates = components(&bom, "pkg:cargo/");
    let missing: Vec<_> = linked("singleton-controller")?
        .into_iter()
        .filter(|c| !crates.contains(c))
        .collect();
    ensure!(
        missing.is_empty(),
        "crates linked into the controller but not in its image's SBOM (or at another version): {missing:?}"
    );

    let debs = components(&bom, "pkg:deb/debian/");
    for lib in ["libc6", "libgcc-s1"] {
        let want = (lib.to_string(), deb_version(lib)?);
        ensure!(
            debs.contains(&want),
            "the image's SBOM lacks {want:?}; it has {debs:?}"
        );
    }
    println!(
        "the controller image's SBOM: {} crates, Debian packages {debs:?}",
        crates.len()
    );
    Ok(())
}

#[test]
fn every_workspace_package_has_its_sbom() -> Result<()> {
    let meta = run_ok(Command::new("cargo").current_dir(repo_file("")).args([
        "metadata",
        "--no-deps",
        "--locked",
        "--format-version",
        "1",
    ]))?;
    let meta: Value = serde_json::from_str(&meta)?;
    for p in meta["packages"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or_default();
        let bom = read(repo_file(&format!(".cache/images/sbom/{name}.cdx.json")))?;
        let described = &bom["metadata"]["component"];
        ensure!(
            described["name"] == name && bom["bomFormat"] == "CycloneDX",
            "{name}'s SBOM describes {described}"
        );
        ensure!(
            !components(&bom, "pkg:cargo/").is_empty(),
            "{name}'s SBOM lists no crates"
        );
    }
    Ok(())
}

/// Checks what every image's SBOM says of itself: CycloneDX 1.5, the image `name` described.
fn check_header(bom: &Value, name: &str) -> Result<()> {
    ensure!(
        bom["bomFormat"] == "CycloneDX" && bom["specVersion"] == "1.5",
        "{name}: bomFormat {}, specVersion {}",
        bom["bomFormat"],
        bom["specVersion"]
    );
    let image = &bom["metadata"]["component"];
    ensure!(
        image["type"] == "container" && image["name"] == name,
        "the described component is the image {name}: {image}"
    );
    Ok(())
}

/// Where hack/image.sh builds the examples' images from, and keeps what it staged (the Go binary,
/// the Python venv): `$SINGLETON_CACHE/examples`, by default `~/.cache/singleton-controller`'s
/// (hack/versions.sh).
fn examples_cache() -> Result<PathBuf> {
    let set = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let base = match set("SINGLETON_CACHE") {
        Some(dir) => dir,
        None => set("XDG_CACHE_HOME")
            .or_else(|| set("HOME").map(|h| h.join(".cache")))
            .context("neither SINGLETON_CACHE, XDG_CACHE_HOME nor HOME is set")?
            .join("singleton-controller"),
    };
    Ok(base.join("examples"))
}

/// A file hack/image.sh staged, which must still be there.
fn staged(path: PathBuf) -> Result<PathBuf> {
    ensure!(
        path.exists(),
        "{}: missing; hack/image.sh (make image) builds it for its image",
        path.display()
    );
    Ok(path)
}

/// `go version -m`'s modules of a binary: each `dep`, or what replaces it. A dependency replaced
/// by a directory (the fence library, `=> ../../../clients/go (devel)`) has no version: its
/// module path with `None`.
fn go_modules(info: &str) -> Result<Vec<(String, Option<String>)>> {
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for line in info.lines() {
        let f: Vec<&str> = line.trim_start().split('\t').collect();
        match f.as_slice() {
            ["dep", path, version, ..] => out.push((path.to_string(), Some(version.to_string()))),
            ["=>", path, version, ..] => {
                let dep = out
                    .last_mut()
                    .context("go version -m: a replacement before any dep")?;
                *dep = if *version == "(devel)" {
                    (dep.0.clone(), None)
                } else {
                    (path.to_string(), Some(version.to_string()))
                };
            }
            _ => {}
        }
    }
    ensure!(!out.is_empty(), "go version -m lists no module:\n{info}");
    Ok(out)
}

#[test]
fn the_go_images_sbom_names_every_module_its_binary_links() -> Result<()> {
    let bom = read(repo_file(".cache/images/billing-workload-go.cdx.json"))?;
    check_header(&bom, "localhost/singleton/billing-workload-go")?;
    let binary = staged(examples_cache()?.join("go/bin/billing-workload"))?;
    let info = run_ok(Command::new("go").arg("version").arg("-m").arg(&binary))?;
    let modules = components(&bom, "pkg:golang/");

    let missing: Vec<_> = go_modules(&info)?
        .into_iter()
        .filter(|(path, version)| match version {
            Some(v) => !modules.contains(&(path.clone(), v.clone())),
            // A directory's module: cyclonedx-gomod gives it the last commit's pseudo-version.
            None => !modules.iter().any(|(p, _)| p == path),
        })
        .collect();
    ensure!(
        missing.is_empty(),
        "modules `go version -m {}` lists but the Go image's SBOM does not (or at another \
         version): {missing:?}; it has {modules:?}",
        binary.display()
    );
    // The standard library, linked in too, at the toolchain's version; and the main module.
    let go = info
        .lines()
        .next()
        .and_then(|l| l.rsplit(' ').next())
        .context("go version -m: no Go version")?;
    ensure!(
        modules.contains(&("std".to_string(), go.to_string())),
        "the Go image's SBOM lacks std {go}: {modules:?}"
    );
    let main = info
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("mod\t")?.split('\t').next())
        .context("go version -m: no main module")?;
    ensure!(
        modules.iter().any(|(p, _)| p == main),
        "the Go image's SBOM lacks its main module {main}"
    );
    let debs = components(&bom, "pkg:deb/");
    ensure!(
        debs.is_empty(),
        "the Go image is a static binary alone, yet its SBOM lists Debian packages {debs:?}"
    );
    println!(
        "the Go image's SBOM: {} modules (std {go} included)",
        modules.len()
    );
    Ok(())
}

/// A Python distribution's name as PyPI compares them (PEP 503): `typing_extensions` is
/// `typing-extensions`.
fn pep503(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        let c = if matches!(c, '-' | '_' | '.') {
            '-'
        } else {
            c.to_ascii_lowercase()
        };
        if c != '-' || !out.ends_with('-') {
            out.push(c);
        }
    }
    out
}

/// `find <dir>` of the shared objects (`*.so`, `*.so.*`) under `dir`, less the paths `prune`.
fn shared_objects(dir: &str, prune: &[String]) -> Result<Vec<String>> {
    let mut find = Command::new("find");
    find.arg(dir);
    for p in prune {
        find.args(["-path", p, "-prune", "-o"]);
    }
    find.args([
        "-type", "f", "(", "-name", "*.so", "-o", "-name", "*.so.*", ")", "-print",
    ]);
    Ok(run_ok(&mut find)?.lines().map(str::to_string).collect())
}

/// The Debian package (`name` or `name:arch`) that installed `path`'s bytes: dpkg knows a file by
/// the path it unpacked (before or after the /usr merge), so its real path, then the path itself.
fn deb_owner(path: &str) -> Result<String> {
    let real = std::fs::canonicalize(path)
        .with_context(|| format!("{path}: missing"))?
        .to_string_lossy()
        .into_owned();
    for p in [real.as_str(), path] {
        let out = Command::new("dpkg-query").args(["-S", p]).output()?;
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text
                .lines()
                .find(|l| !l.starts_with("diversion by "))
                .with_context(|| format!("dpkg-query -S {p}: {text}"))?;
            // "pkg[:arch][, other[:arch]]: path": the first package.
            let owners = line.split(": ").next().unwrap_or_default();
            return Ok(owners.split(", ").next().unwrap_or_default().to_string());
        }
    }
    anyhow::bail!("no Debian package owns {path} ({real})")
}

#[test]
fn the_python_images_sbom_names_every_distribution_and_debian_package_it_holds() -> Result<()> {
    let bom = read(repo_file(".cache/images/billing-workload-python.cdx.json"))?;
    check_header(&bom, "localhost/singleton/billing-workload-python")?;
    let venv = staged(examples_cache()?.join("python/venv-image"))?;
    let python = venv.join("bin/python");

    // The venv's distributions, less pip and setuptools, which hack/image.sh does not stage.
    let listed = run_ok(Command::new(&python).args([
        "-I",
        "-c",
        "import importlib.metadata as m\nfor d in m.distributions(): print(d.metadata['Name'], d.version)",
    ]))?;
    let mut installed = BTreeSet::new();
    for line in listed.lines() {
        let (name, version) = line
            .split_once(' ')
            .with_context(|| format!("{}: {line:?}", python.display()))?;
        installed.insert((pep503(name), version.to_string()));
    }
    let not_staged = ["pip", "setuptools"];
    let in_image: BTreeSet<_> = installed
        .iter()
        .filter(|(n, _)| !not_staged.contains(&n.as_str()))
        .cloned()
        .collect();
    ensure!(
        ["psycopg", "psycopg-binary", "singleton-fence"]
            .iter()
            .all(|n| in_image.iter().any(|(i, _)| i == n)),
        "{} lacks the workload's packages: {installed:?}",
        venv.display()
    );
    let pypi: BTreeSet<_> = components(&bom, "pkg:pypi/")
        .into_iter()
        .map(|(n, v)| (pep503(&n), v))
        .collect();
    let missing: Vec<_> = in_image.difference(&pypi).collect();
    ensure!(
        missing.is_empty(),
        "distributions of the image's venv but not in its SBOM (or at another version): \
         {missing:?}; it has {pypi:?}"
    );
    let extra: Vec<_> = pypi.difference(&in_image).collect();
    ensure!(
        extra.is_empty(),
        "the Python image's SBOM lists distributions the image does not hold: {extra:?}"
    );

    // The interpreter hack/image.sh stages (Debian's /usr/bin/python3), the shared objects of its
    // standard library (less the tests and config-*, not staged) and of the venv, and every library
    // ldd resolves for them outside the venv (a wheel's own are psycopg-binary's).
    let interpreter = "/usr/bin/python3";
    let stdlib = run_ok(Command::new(interpreter).args([
        "-c",
        "import sysconfig; print(sysconfig.get_paths()['stdlib'])",
    ]))?
    .trim()
    .to_string();
    let site = run_ok(Command::new(&python).args([
        "-I",
        "-c",
        "import sysconfig; print(sysconfig.get_paths()['purelib'])",
    ]))?
    .trim()
    .to_string();
    let stdlib_so = shared_objects(
        &stdlib,
        &[format!("{stdlib}/test"), format!("{stdlib}/config-*")],
    )?;
    let venv_so = shared_objects(&site, &[])?;
    ensure!(
        !stdlib_so.is_empty() && !venv_so.is_empty(),
        "no shared objects in {stdlib} or {site}"
    );
    let mut debian_files: BTreeSet<String> = stdlib_so.iter().cloned().collect();
    debian_files.insert(interpreter.to_string());
    for file in stdlib_so
        .iter()
        .chain(&venv_so)
        .map(String::as_str)
        .chain([interpreter])
    {
        for line in run_ok(Command::new("ldd").arg(file))?.lines() {
            let lib = match line.split_once("=> ") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line
                    .split_whitespace()
                    .next()
                    .filter(|w| w.starts_with('/')),
            };
            if let Some(lib) = lib.filter(|l| l.starts_with('/') && !l.starts_with(&site)) {
                debian_files.insert(lib.to_string());
            }
        }
    }
    let debs = components(&bom, "pkg:deb/debian/");
    let mut wanted = BTreeSet::new();
    for file in &debian_files {
        let owner = deb_owner(file)?;
        let name = owner.split(':').next().unwrap_or_default().to_string();
        wanted.insert((name, deb_version(&owner)?));
    }
    let missing: Vec<_> = wanted.difference(&debs).collect();
    ensure!(
        missing.is_empty(),
        "Debian packages of the Python image's interpreter and libraries ({} files) but not in \
         its SBOM (or at another version): {missing:?}; it has {debs:?}",
        debian_files.len()
    );
    println!(
        "the Python image's SBOM: distributions {pypi:?}; {} Debian packages, {} of them checked \
         against the interpreter, {} standard-library extensions and the libraries they link ({} \
         files)",
        debs.len(),
        wanted.len(),
        stdlib_so.len(),
        debian_files.len()
    );
    Ok(())
}
