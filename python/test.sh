#!/usr/bin/env bash
# The Python package's tests: installs the package into a virtual
# environment under target/ with `pip install ./python` (maturin, on the dev
# profile: about two minutes from a fresh clone, since pyo3's and numpy's
# crates change some shared dependencies' features and wgpu is rebuilt;
# seconds after that), then runs pytest on python/tests. Needs python3 with
# venv (.ci/setup --python).
#
#   bash python/test.sh [pytest args]           NumPy only (the README's test command)
#   bash python/test.sh --torch [pytest args]   with PyTorch (its own venv; CI's own step):
#                                               the PyTorch tests and the ring across processes
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/python-venv
packages=(maturin numpy pytest ml_dtypes)
if [ "${1:-}" = "--torch" ]; then
  shift
  # PyPI's torch brings CUDA's libraries (about 5 GB installed, under a
  # minute here): a venv of its own, so the NumPy-only one stays small.
  venv=target/python-venv-torch
  packages+=(torch)
  export WEBATTN_REQUIRE_TORCH=1
fi
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
export PATH="$PWD/$venv/bin:$PATH"
start=$SECONDS
python -m pip install -q --disable-pip-version-check "${packages[@]}"
echo "python: ${packages[*]} present in $((SECONDS - start)) s" >&2
start=$SECONDS
MATURIN_PEP517_ARGS="--profile dev" python -m pip install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python
echo "python: the package built and installed in $((SECONDS - start)) s" >&2
python -m pytest -q python/tests "$@"
