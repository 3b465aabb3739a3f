"""An image's CycloneDX SBOM (hack/image.sh): its binary's SBOM from cargo-cyclonedx, with the
image as the described component and a component per Debian package its libraries come from.

Usage: sbom-image.py <binary's .cdx.json> <image ref>  < "name<TAB>arch<TAB>version" lines
Writes the image's SBOM (CycloneDX 1.5 JSON) to stdout. No library merges CycloneDX documents
and adds dpkg's packages (syft would, but it scans images with a container engine or registry,
neither of which this machine has), so this does only that.
"""

import json
import sys


def main() -> None:
    binary_sbom, ref = sys.argv[1], sys.argv[2]
    bom = json.load(open(binary_sbom))
    app = bom["metadata"]["component"]
    name, _, version = ref.rpartition(":")
    image = {
        "type": "container",
        "bom-ref": ref,
        "name": name,
        "version": version,
        "description": f"from scratch: {app['name']} and the libraries it links",
    }
    debs = []
    for line in sys.stdin:
        pkg, arch, ver = line.rstrip("\n").split("\t")
        debs.append(
            {
                "type": "library",
                "bom-ref": f"pkg:deb/debian/{pkg}@{ver}?arch={arch}",
                "name": pkg,
                "version": ver,
                "purl": f"pkg:deb/debian/{pkg}@{ver}?arch={arch}",
                "scope": "required",
            }
        )
    if not debs:
        sys.exit("sbom-image.py: no Debian packages for the image's libraries")
    bom["metadata"]["component"] = image
    bom["components"] = [app] + debs + bom["components"]
    bom.setdefault("dependencies", []).append(
        {"ref": ref, "dependsOn": [app["bom-ref"]] + [d["bom-ref"] for d in debs]}
    )
    json.dump(bom, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
