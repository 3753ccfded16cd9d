// The JavaScript library's tests, for node's test runner:
//   node --test web/tests/library.test.mjs        (after bash web/build.sh)
// Installs the packed tarball (target/npm/webattn-*.tgz) into a scratch app
// with npm, serves it with the test page, and runs the suite in Debian's headless
// Chromium: on the page and in a Web Worker, on WebGPU (SwiftShader) and on the
// CPU backend. Every case of the suite is a subtest here; its details (worst
// errors, timings) are printed.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../..");
const TYPES = { ".html": "text/html; charset=utf-8", ".js": "text/javascript", ".wasm": "application/wasm" };

/** Installs the tarball into a scratch app with npm, as a web app would;
 * returns the app folder and the installed package's folder. */
function install() {
  const dir = path.join(root, "target/npm");
  const tarball = fs.existsSync(dir) && fs.readdirSync(dir).find((f) => /^webattn-.*\.tgz$/.test(f));
  assert.ok(tarball, "no target/npm/webattn-*.tgz: run bash web/build.sh first");
  const app = fs.mkdtempSync(path.join(os.tmpdir(), "webattn-app-"));
  fs.writeFileSync(path.join(app, "package.json"), JSON.stringify({ name: "app", private: true }));
  execFileSync("npm", ["install", "--offline", "--no-audit", "--no-fund", "--loglevel=error", path.join(dir, tarball)], { cwd: app, stdio: "inherit" });
  const pkg = path.join(app, "node_modules/webattn");
  for (const file of ["webattn.js", "index.d.ts", "README.md", "pkg/webattn_web.js", "pkg/webattn_web_bg.wasm",
    "pkg/webattn_web_relaxed_bg.wasm"]) {
    assert.ok(fs.existsSync(path.join(pkg, file)), `the tarball lacks ${file}`);
  }
  return { app, pkg };
}

/** Serves /webattn/* from the unpacked package and the rest from tests/library/. */
function serve(pkg) {
  const server = http.createServer(async (req, res) => {
    const url = new URL(req.url, "http://127.0.0.1");
    const [base, rel] = url.pathname.startsWith("/webattn/")
      ? [pkg, url.pathname.slice("/webattn/".length)]
      : [path.join(here, "library"), url.pathname === "/" ? "index.html" : url.pathname.slice(1)];
    const file = path.join(base, path.normalize(decodeURIComponent(rel)));
    if (!file.startsWith(base)) return res.writeHead(403).end();
    try {
      const body = await fs.promises.readFile(file);
      res.writeHead(200, { "content-type": TYPES[path.extname(file)] ?? "application/octet-stream" }).end(body);
    } catch {
      res.writeHead(404).end("not found");
    }
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(server)));
}

const { app, pkg } = install();
const server = await serve(pkg);
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "webattn-chromium-lib-"));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  ignoreDefaultArgs: ["--headless"],
  args: ["--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"],
});

async function suite(t, query) {
  const page = await browser.newPage();
  const panics = [];
  page.on("console", (m) => {
    if (m.type() !== "error") return;
    console.log(`[page error] ${m.text()}`);
    if (/panicked|unreachable|RuntimeError/.test(m.text())) panics.push(m.text());
  });
  page.on("pageerror", (e) => console.log(`[page exception] ${e}`));
  await page.goto(`http://127.0.0.1:${server.address().port}/?${query}`);
  const results = await page.waitForFunction(() => window.results, null, { timeout: 600_000, polling: 250 })
    .then((h) => h.jsonValue());
  await page.close();
  assert.ok(results.length > 1, `the suite did not run: ${JSON.stringify(results)}`);
  await t.test("nothing panicked into the console", () => assert.deepEqual(panics, []));
  for (const r of results) {
    await t.test(r.name, () => {
      t.diagnostic(`${r.name} (${(r.ms / 1000).toFixed(1)} s): ${r.detail}`);
      assert.ok(r.ok, r.detail);
    });
  }
}

test.after(async () => {
  await browser.close();
  server.close();
  fs.rmSync(profile, { recursive: true, force: true });
  fs.rmSync(app, { recursive: true, force: true });
});

// The suite on WebGPU (SwiftShader: about a minute) on the page or in a
// Worker, on a rotation that WEBATTN_ROTATION (else the day) picks; the CPU
// backend every time on both wasm builds: the one the library picks (SIMD128
// on x86-64, relaxed SIMD on ARM) on the page, relaxed SIMD in a Worker.
const turn = Number(process.env.WEBATTN_ROTATION ?? Math.floor(Date.now() / 86_400_000));
console.log(`rotation for WebGPU: ${turn % 2 === 0 ? "the page" : "the Worker"} (WEBATTN_ROTATION=${turn} repeats it)`);
if (turn % 2 === 0) {
  test("page, WebGPU", { timeout: 600_000 }, (t) => suite(t, "backend=gpu"));
} else {
  test("Web Worker, WebGPU", { timeout: 600_000 }, (t) => suite(t, "backend=gpu&worker=1"));
}
test("Web Worker, CPU backend, the relaxed-SIMD build", { timeout: 600_000 },
  (t) => suite(t, "backend=cpu&worker=1&simd=relaxed&isa=relaxed-simd"));
const auto = process.arch === "arm64" ? "relaxed-simd" : "simd128";
test(`page, CPU backend, the build the library picks (${auto})`, { timeout: 600_000 },
  (t) => suite(t, `backend=cpu&isa=${auto}`));
