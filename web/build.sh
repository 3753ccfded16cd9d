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
# Both builds in one target folder, sharing every dependency: the .wasm
# has one name there, so each is copied away as soon as it is built (cargo
# rebuilds the crate whenever the features switch), and the two must differ.
wasm=target/wasm32-unknown-unknown/release/webattn_web.wasm
builds=target/wasm-builds
mkdir -p "$builds"
cargo build -p webattn-web --target wasm32-unknown-unknown --release
cp "$wasm" "$builds/simd128.wasm"
# The second build, with the CPU backend's micro-kernels on relaxed SIMD
# (the relaxed-simd feature: src/cpu/fast/relaxed.rs).
cargo build -p webattn-web --target wasm32-unknown-unknown --release --features relaxed-simd
cp "$wasm" "$builds/relaxed.wasm"
if cmp -s "$builds/simd128.wasm" "$builds/relaxed.wasm"; then
  echo "web/build.sh: the relaxed-SIMD build came out the same as the SIMD128 build" >&2
  exit 1
fi
rm -rf web/lib/pkg "$builds/relaxed-pkg"
bindgen() { wasm-bindgen --target web --no-typescript --out-name webattn_web --out-dir "$@"; }
bindgen web/lib/pkg "$builds/simd128.wasm"
bindgen "$builds/relaxed-pkg" "$builds/relaxed.wasm"
# One glue module serves both: their code must be the same (comments aside).
code() { grep -v '^[[:space:]]*//' "$1"; }
if ! cmp -s <(code web/lib/pkg/webattn_web.js) <(code "$builds/relaxed-pkg/webattn_web.js"); then
  echo "web/build.sh: the relaxed-SIMD build's glue differs from the SIMD128 build's" >&2
  exit 1
fi
cp "$builds/relaxed-pkg/webattn_web_bg.wasm" web/lib/pkg/webattn_web_relaxed_bg.wasm
mkdir -p target/npm
rm -f target/npm/webattn-*.tgz
tarball=$(cd web/lib && npm pack --silent --pack-destination ../../target/npm)
echo "web/build.sh: built web/lib/pkg ($(du -h web/lib/pkg/webattn_web_bg.wasm | cut -f1) of wasm, and as much with relaxed SIMD) and target/npm/$tarball" >&2
