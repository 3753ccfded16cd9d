#!/usr/bin/env bash
# Builds the JavaScript library: the engine to wasm (release), wasm-bindgen's
# glue into web/lib/pkg, then `npm pack` of web/lib into target/npm/ (the
# tarball a web app installs). The demo page imports web/lib/webattn.js. The
# wasm-bindgen CLI must match the wasm-bindgen crate in Cargo.lock
# (.ci/setup --web installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3; exit }' Cargo.lock)
have=$(wasm-bindgen --version 2>/dev/null | awk '{print $2}' || true)
if [ "$have" != "$want" ]; then
  echo "web/build.sh: wasm-bindgen CLI $want is needed (found '${have:-none}'):" >&2
  echo "  cargo install wasm-bindgen-cli --version $want" >&2
  exit 1
fi
cargo build -p webattn-web --target wasm32-unknown-unknown --release
rm -rf web/lib/pkg
wasm-bindgen --target web --no-typescript --out-dir web/lib/pkg \
  target/wasm32-unknown-unknown/release/webattn_web.wasm
mkdir -p target/npm
rm -f target/npm/webattn-*.tgz
tarball=$(cd web/lib && npm pack --silent --pack-destination ../../target/npm)
echo "web/build.sh: built web/lib/pkg ($(du -h web/lib/pkg/webattn_web_bg.wasm | cut -f1) of wasm) and target/npm/$tarball" >&2
