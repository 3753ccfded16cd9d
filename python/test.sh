#!/usr/bin/env bash
# The Python package's tests: installs the package into a virtual
# environment under target/ with `pip install ./python` (maturin, on the dev
# profile so it reuses the test build's compiled dependencies), then runs
# pytest on python/tests. Needs python3 with venv (.ci/setup --python).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/python-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
export PATH="$PWD/$venv/bin:$PATH"
python -m pip install -q --disable-pip-version-check maturin numpy pytest ml_dtypes
start=$SECONDS
MATURIN_PEP517_ARGS="--profile dev" python -m pip install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python
echo "python: the package built and installed in $((SECONDS - start)) s" >&2
python -m pytest -q python/tests "$@"
