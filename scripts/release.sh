#!/usr/bin/env bash
# Build kernelcache's release artifacts, the sdist and the wheel built from it, into OUT (default dist/):
#   bash scripts/release.sh [OUT]
# Reproducible: the sources are the committed tree of HEAD (git archive: nothing untracked or modified gets in),
# the build backend is pinned (scripts/release-constraints.txt; hatchling sorts the members and normalizes their
# modes and owners), and SOURCE_DATE_EPOCH is the commit's time (every time stamp in both archives), so two builds
# of one commit give the same bytes. Prints each artifact's sha256.
# KERNELCACHE_RELEASE_TREE=worktree builds the working tree as it is instead (what the tests install while code is
# being changed; never a release). Needs git and Python 3.12 (PYTHON=, else found as scripts/setup.sh finds it);
# it gets uv itself into build/uv (or takes UV=), as setup.sh does: scripts/uv.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
source scripts/uv.sh
PY312=$(python312)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct HEAD)}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "${KERNELCACHE_RELEASE_TREE:-head}" = worktree ]; then
  source=$PWD
else
  if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "release: note: uncommitted changes are not in these artifacts (they are built from HEAD)" >&2
  fi
  source=$tmp/src
  mkdir "$source"
  git archive --format=tar HEAD | tar -x -C "$source"
fi
mkdir -p "$out"
"$UV" build -q --python "$PY312" --build-constraints scripts/release-constraints.txt --out-dir "$tmp/dist" "$source"
for artifact in "$tmp"/dist/kernelcache-*.tar.gz "$tmp"/dist/kernelcache-*.whl; do
  mv -f "$artifact" "$out/"
  sha256sum "$out/$(basename "$artifact")"
done
