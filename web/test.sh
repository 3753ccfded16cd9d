#!/usr/bin/env bash
# The browser tests: builds the wasm and the npm tarball, then in Debian's
# headless Chromium (playwright-core):
#  1. the JavaScript library from the packed tarball, on a page and in a Web
#     Worker, on WebGPU (SwiftShader) and on the CPU backend (node --test);
#  2. the demo page (the library's first user): the conformance sweep, every
#     kernel through Chrome's compiler, the sentence, explorer and timing;
#     the heatmap screenshot goes to $1 (default target/web-heatmap.png);
#  3. the demo in a Chromium that grants no WebGPU adapter: the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
shot=${1:-target/web-heatmap.png}
mkdir -p "$(dirname "$shot")"
bash web/build.sh
if [ ! -d web/node_modules/playwright-core ]; then
  (cd web && npm ci --no-audit --no-fund --loglevel=error)
fi
node --test --test-reporter=spec web/tests/library.test.mjs
node web/tests/e2e.mjs "$shot"
node web/tests/cpu.mjs
