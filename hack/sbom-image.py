"""An image's CycloneDX SBOM (hack/image.sh): the SBOM its application's tool made (cargo-cyclonedx
for a Rust binary, cyclonedx-gomod for the Go one, cyclonedx-py for the Python image's
site-packages), with the image as the described component and a component per Debian package its
other files come from.

Usage: sbom-image.py <tool's .cdx.json> <image ref> [options]  < "name<TAB>arch<TAB>version" lines
  --static            the image holds a static binary alone: no Debian package (stdin unread)
  --root DIR          the Debian packages are those dpkg says own the files of the image's root
                      DIR (stdin unread): a file is looked up at its real path on this machine,
                      where the image's files were staged from, then at its path (each also on
                      the other side of the /usr merge, /lib or /usr/lib); a byte-compiled
                      __pycache__/<module>.cpython-*.pyc belongs to the package of its <module>.py
                      (Debian compiles them when it installs the package). A file no package owns
                      is an error.
  --skip PATH         with --root: a directory of the image whose files are not Debian's (repeat)
  --app NAME VERSION  the tool's SBOM describes no component (cyclonedx-py environment): the
                      image's application is NAME at VERSION, depending on the tool's components
                      that no other component depends on
  --pypi-local        the tool's components without a purl are Python distributions installed
                      from a local directory (cyclonedx-py gives those none; here: the fence
                      library, clients/python): each gets pkg:pypi/<name>@<version>, and loses
                      the file:// reference to the directory it was built on
Writes the image's SBOM (CycloneDX 1.5 JSON) to stdout; dated SOURCE_DATE_EPOCH when the tool's
has no date. No library merges CycloneDX documents and adds dpkg's packages (syft would, but it
scans images with a container engine or registry, neither of which this machine has), so this does
only that.
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
from typing import NoReturn

PYC = re.compile(r"^(.*)/__pycache__/([^/.]+)\.cpython-[0-9]+(?:\.opt-[12])?\.pyc$")


def fail(message: str) -> NoReturn:
    sys.exit(f"sbom-image.py: {message}")


def image_files(root: str, skips: list[str]) -> list[str]:
    """Every file and symbolic link of the root, by its path in the image, outside the skips."""
    out = []
    for top, dirs, names in os.walk(root):
        rel = os.path.relpath(top, root)
        rel = "/" if rel == "." else "/" + rel
        keep = []
        for d in dirs:
            path = os.path.join(rel, d)
            if any(path == s or path.startswith(s + "/") for s in skips):
                continue
            if os.path.islink(os.path.join(top, d)):
                names.append(d)  # a link to a directory is a file of the image
            else:
                keep.append(d)
        dirs[:] = keep
        out.extend(os.path.join(rel, n) for n in names)
    return sorted(out)


def candidates(root: str, path: str) -> list[str]:
    """The paths dpkg may know an image file by: a staged copy by its real path here first (the
    interpreter is /usr/bin/python3 in the image, python3.11's file here), then as staged (a
    library by the path ldd printed, /lib/... for a file dpkg lists there)."""
    m = PYC.match(path)
    if m:
        path = f"{m.group(1)}/{m.group(2)}.py"
    first = [path] if os.path.islink(root + path) else [os.path.realpath(path), path]
    out = []
    for p in first:
        # The /usr merge: dpkg may list a file under /lib or under /usr/lib, whichever its package
        # unpacked it to.
        alias = re.sub(r"^/usr(/(?:s?bin|lib(?:32|64|x32)?)/)", r"\1", p)
        if alias == p and re.match(r"^/(?:s?bin|lib(?:32|64|x32)?)/", p):
            alias = "/usr" + p
        out.extend(x for x in (p, alias) if x not in out)
    return out


def dpkg_owners(paths: list[str]) -> dict[str, list[str]]:
    """path -> the packages (name:arch, or name for Architecture: all) dpkg says own it."""
    owners: dict[str, list[str]] = {}
    todo = sorted(set(paths))
    for i in range(0, len(todo), 500):
        # Exit 1 when some path has no owner: those are simply absent from the answer.
        p = subprocess.run(["dpkg-query", "-S", *todo[i : i + 500]], capture_output=True, text=True)
        if p.returncode not in (0, 1):
            fail(f"dpkg-query -S failed ({p.returncode}): {p.stderr.strip()}")
        for line in p.stdout.splitlines():
            if line.startswith("diversion by "):
                continue
            pkgs, sep, path = line.partition(": ")
            if sep:
                owners[path] = [x.strip() for x in pkgs.split(",")]
    return owners


def debs_of_root(root: str, skips: list[str]) -> list[tuple[str, str, str]]:
    files = image_files(root, skips)
    if not files:
        fail(f"{root} holds no file outside {skips}")
    cands = {f: candidates(root, f) for f in files}
    owners = dpkg_owners([c for cs in cands.values() for c in cs])
    pkgs, orphans = set(), []
    for f, cs in cands.items():
        owner = next((owners[c] for c in cs if c in owners), None)
        if owner is None:
            orphans.append(f)
        else:
            pkgs.update(owner)
    if orphans:
        shown = ", ".join(orphans[:10]) + (f" and {len(orphans) - 10} more" if len(orphans) > 10 else "")
        fail(f"no Debian package owns {len(orphans)} file(s) of the image: {shown}")
    p = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package}\t${Architecture}\t${Version}\n", *sorted(pkgs)],
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        fail(f"dpkg-query -W {' '.join(sorted(pkgs))}: {p.stderr.strip()}")
    return [tuple(line.split("\t")) for line in p.stdout.splitlines()]


def debs_of_stdin() -> list[tuple[str, str, str]]:
    out = []
    for n, line in enumerate(sys.stdin, 1):
        fields = line.rstrip("\n").split("\t")
        if len(fields) != 3 or not all(fields):
            fail(f"stdin line {n}: {line.rstrip()!r} is not name<TAB>arch<TAB>version")
        out.append(tuple(fields))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="sbom-image.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("sbom")
    ap.add_argument("ref")
    ap.add_argument("--static", action="store_true")
    ap.add_argument("--root")
    ap.add_argument("--skip", action="append", default=[])
    ap.add_argument("--app", nargs=2, metavar=("NAME", "VERSION"))
    ap.add_argument("--pypi-local", action="store_true")
    args = ap.parse_args()
    if args.static and args.root:
        fail("--static and --root: a static binary's image has no Debian files to look up")
    if args.skip and not args.root:
        fail("--skip needs --root")

    try:
        with open(args.sbom) as f:
            bom = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{args.sbom}: {e}")
    if bom.get("bomFormat") != "CycloneDX" or bom.get("specVersion") != "1.5":
        fail(f"{args.sbom} is not a CycloneDX 1.5 SBOM")
    name, _, version = args.ref.rpartition(":")
    if not name or not version:
        fail(f"{args.ref}: not an image reference <name>:<tag>")
    metadata = bom.setdefault("metadata", {})
    components = bom.setdefault("components", [])
    dependencies = bom.setdefault("dependencies", [])

    if args.pypi_local:
        for c in components:
            if "purl" in c:
                continue
            c["purl"] = f"pkg:pypi/{c['name']}@{c['version']}"
            refs = [r for r in c.get("externalReferences", []) if not r["url"].startswith("file:")]
            if refs:
                c["externalReferences"] = refs
            else:
                c.pop("externalReferences", None)

    if args.app:
        if "component" in metadata:
            fail(f"--app: {args.sbom} describes {metadata['component'].get('name')} already")
        app = {
            "type": "application",
            "bom-ref": f"{args.app[0]}@{args.app[1]}",
            "name": args.app[0],
            "version": args.app[1],
        }
        needed = {d for dep in dependencies for d in dep.get("dependsOn", [])}
        roots = [c["bom-ref"] for c in components if c["bom-ref"] not in needed]
        if components and not roots:
            fail(f"--app: every component of {args.sbom} is a dependency of another")
        dependencies.append({"ref": app["bom-ref"], "dependsOn": roots})
    elif "component" in metadata:
        app = metadata["component"]
    else:
        fail(f"{args.sbom} describes no component: say which with --app")

    if args.static:
        debs = []
        what = f"{app['name']}, a static binary, alone"
    else:
        debs = debs_of_root(args.root, args.skip) if args.root else debs_of_stdin()
        if not debs:
            fail("no Debian packages for the image's libraries (a static binary: --static)")
        what = f"{app['name']} and " + (
            "the files of Debian's packages it needs" if args.root else "the libraries it links"
        )
    image = {
        "type": "container",
        "bom-ref": args.ref,
        "name": name,
        "version": version,
        "description": f"from scratch: {what}",
    }
    deb_components = [
        {
            "type": "library",
            "bom-ref": f"pkg:deb/debian/{pkg}@{ver}?arch={arch}",
            "name": pkg,
            "version": ver,
            "purl": f"pkg:deb/debian/{pkg}@{ver}?arch={arch}",
            "scope": "required",
        }
        for pkg, arch, ver in debs
    ]
    metadata["component"] = image
    if "timestamp" not in metadata and os.environ.get("SOURCE_DATE_EPOCH"):
        when = datetime.datetime.fromtimestamp(int(os.environ["SOURCE_DATE_EPOCH"]), datetime.timezone.utc)
        metadata["timestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    bom["components"] = [app] + deb_components + components
    dependencies.append({"ref": args.ref, "dependsOn": [app["bom-ref"]] + [d["bom-ref"] for d in deb_components]})
    json.dump(bom, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
