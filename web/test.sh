#!/usr/bin/env bash
# The end-to-end browser test: builds the wasm, serves web/ on 127.0.0.1, runs
# the conformance sweep in headless Chromium's WebGPU, and fails unless the
# page reads "N passed, 0 failed"; then again in a Chromium without WebGPU,
# where the page falls back to the CPU backend. The heatmap screenshot goes to
# $1 (default target/web-heatmap.png).
set -euo pipefail
cd "$(dirname "$0")/.."
shot=${1:-target/web-heatmap.png}
mkdir -p "$(dirname "$shot")"
bash web/build.sh
if [ ! -d web/node_modules/playwright-core ]; then
  (cd web && npm ci --no-audit --no-fund --loglevel=error)
fi
node web/tests/e2e.mjs "$shot"
# The same page in a browser that grants no WebGPU adapter: the CPU backend.
node web/tests/cpu.mjs
