#!/usr/bin/env bash
# The package as users install it: builds the sdist and the wheel (the wheel from the sdist,
# as `python -m build` does, so the sdist must hold what the wheel needs), checks that the sdist
# holds the C++ sources, LICENSE and README.md, installs the wheel (not editable) and torch
# 2.13.0 into a fresh venv, and runs .ci/wheel_smoke.py there from an empty folder outside
# the checkout. Run by .ci/run from the repository root with the project's venv active.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

start=$(date +%s)
pip install -q build
python -m build --outdir "$tmp/dist" . >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
built=$(($(date +%s) - start))
sdist=$(echo "$tmp"/dist/torch_jax-*.tar.gz)
wheel=$(echo "$tmp"/dist/torch_jax-*.whl)
# (the members' paths without the sdist's top folder, torch_jax-VERSION/)
tar -tzf "$sdist" | sed 's|^[^/]*/||' >"$tmp/sdist.txt"
for f in src/torch_jax/ffi/csrc/*.cc src/torch_jax/ffi/csrc/*.h LICENSE README.md; do
    grep -qxF "$f" "$tmp/sdist.txt" || { echo "wheel: the sdist $(basename "$sdist") lacks $f" >&2; exit 1; }
done

start=$(date +%s)
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q torch==2.13.0 "$wheel"
installed=$(($(date +%s) - start))

start=$(date +%s)
mkdir "$tmp/work"
(cd "$tmp/work" && env -u PYTHONPATH "$tmp/venv/bin/python" "$root/.ci/wheel_smoke.py")
echo "wheel: built in $built s, installed in $installed s, smoke test in $(($(date +%s) - start)) s"
