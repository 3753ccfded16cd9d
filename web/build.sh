#!/usr/bin/env bash
# Builds the JavaScript library: the engine to wasm (release) twice (SIMD128,
# and relaxed SIMD beside it), wasm-bindgen's glue into web/lib/pkg, then
# `npm pack` of web/lib into target/npm/ (the tarball a web app installs). The
# demo page imports web/lib/webattn.js. The wasm-bindgen CLI must match the
# wasm-bindgen crate in Cargo.lock (.ci/setup --web installs it).
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
# The second build, with the CPU backend's micro-kernels on relaxed SIMD
# (the relaxed-simd feature: src/cpu/fast/relaxed.rs), in a target folder of
# its own: both builds' .wasm have one name, and cargo would not rebuild the
# one whose sources did not change after the other overwrote it.
cargo build -p webattn-web --target wasm32-unknown-unknown --release --features relaxed-simd \
  --target-dir target/wasm-relaxed
rm -rf web/lib/pkg target/wasm-relaxed/pkg
wasm-bindgen --target web --no-typescript --out-dir web/lib/pkg \
  target/wasm32-unknown-unknown/release/webattn_web.wasm
wasm-bindgen --target web --no-typescript --out-dir target/wasm-relaxed/pkg \
  target/wasm-relaxed/wasm32-unknown-unknown/release/webattn_web.wasm
# One glue module serves both: their code must be the same (comments aside).
code() { grep -v '^[[:space:]]*//' "$1"; }
if ! cmp -s <(code web/lib/pkg/webattn_web.js) <(code target/wasm-relaxed/pkg/webattn_web.js); then
  echo "web/build.sh: the relaxed-SIMD build's glue differs from the SIMD128 build's" >&2
  exit 1
fi
cp target/wasm-relaxed/pkg/webattn_web_bg.wasm web/lib/pkg/webattn_web_relaxed_bg.wasm
mkdir -p target/npm
rm -f target/npm/webattn-*.tgz
tarball=$(cd web/lib && npm pack --silent --pack-destination ../../target/npm)
echo "web/build.sh: built web/lib/pkg ($(du -h web/lib/pkg/webattn_web_bg.wasm | cut -f1) of wasm, and as much with relaxed SIMD) and target/npm/$tarball" >&2
