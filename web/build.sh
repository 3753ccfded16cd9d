#!/usr/bin/env bash
# Builds the demo: the engine to wasm (release), then wasm-bindgen's JS glue
# into web/pkg. The wasm-bindgen CLI must match the wasm-bindgen crate in
# Cargo.lock (.ci/setup --web installs it).
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
wasm-bindgen --target web --no-typescript --out-dir web/pkg \
  target/wasm32-unknown-unknown/release/webattn_web.wasm
echo "web/build.sh: built web/pkg ($(du -h web/pkg/webattn_web_bg.wasm | cut -f1) of wasm)" >&2
