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
