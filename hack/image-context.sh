#!/usr/bin/env bash
# Proves that the Dockerfile's build context compiles without a Docker engine: copies what
# .dockerignore lets into the context to a scratch directory and runs the Dockerfile's cargo
# command there as a check (`--locked`, offline: the registry cache is already warm from the
# workspace's own build). Catches a workspace member or file left out of the context (the image
# build once failed at "failed to load manifest" because bench/ was), and checks that every base
# image is pinned by digest. Run by `make lint`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every base image is pinned by digest (a tag alone may point at other bytes tomorrow).
if unpinned=$(grep -nE '^FROM ' Dockerfile | grep -vE '@sha256:[0-9a-f]{64}( |$)'); then
  echo "Dockerfile: base image not pinned by digest (see the comment at its top):" >&2
  echo "$unpinned" >&2
  exit 1
fi
ctx=$(mktemp -d); trap 'rm -rf "$ctx"' EXIT

# .dockerignore here is "exclude everything, then re-include paths": read exactly that shape and
# refuse anything else rather than guess at Docker's full pattern rules.
seen_star=
while IFS= read -r line; do
  case $line in
    '' | '#'*) ;;
    '*') seen_star=1 ;;
    '!'*)
      [ -n "$seen_star" ] || { echo ".dockerignore: '$line' before '*'" >&2; exit 1; }
      path=${line#!}; path=${path%/}
      [ -e "$path" ] || { echo ".dockerignore re-includes $path, which does not exist" >&2; exit 1; }
      mkdir -p "$ctx/$(dirname "$path")"
      cp -R "$path" "$ctx/$path" ;;
    *) echo ".dockerignore: pattern '$line' is not understood by $0" >&2; exit 1 ;;
  esac
done < .dockerignore
[ -n "$seen_star" ] || { echo ".dockerignore does not start from '*'" >&2; exit 1; }

# The Dockerfile's build command, as a check; the target directory is shared so only the
# workspace's own crates are checked again.
target=${CARGO_TARGET_DIR:-$PWD/target}
(cd "$ctx" && CARGO_TARGET_DIR="$target" cargo check -q --locked --offline \
  -p singleton-controller --bin singleton-controller)
echo "image build context ($(cd "$ctx" && find . -type f | wc -l) files) compiles"
