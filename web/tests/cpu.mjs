// The page without WebGPU: Chromium started without --enable-unsafe-webgpu
// grants no adapter (its only one, SwiftShader, is blocklisted), so the demo
// falls back to the fast CPU backend in wasm. Runs the quick sweep and the
// family's checks on it, the explorer and the sentence on the CPU path, the
// model that learns (its held-out loss below 0.1 after 100 steps), and the
// timing chart against the f64 oracle in wasm; fails unless all pass.
//   node web/tests/cpu.mjs [seqs, e.g. 64,256,1024]
//   WEBATTN_SIMD=relaxed node web/tests/cpu.mjs …   (that wasm build, not the one the library picks)
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";
import { serve } from "../serve.mjs";

const seqs = process.argv[2] ?? "128,512";
const browserPath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const server = await serve(0);
const simd = process.env.WEBATTN_SIMD ? `&simd=${process.env.WEBATTN_SIMD}` : "";
const url = `http://127.0.0.1:${server.address().port}/?check=quick&timing=${seqs}${simd}`;
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "webattn-chromium-cpu-"));
const started = Date.now();
let failed = true;
const context = await chromium.launchPersistentContext(profile, {
  executablePath: browserPath,
  ignoreDefaultArgs: ["--headless"],
  args: [
    "--headless=new", "--no-sandbox", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
  ],
  viewport: { width: 1100, height: 1400 },
});
try {
  const page = context.pages()[0] ?? (await context.newPage());
  page.on("console", (m) => {
    if (m.type() === "error" || m.type() === "warning") console.log(`[page ${m.type()}] ${m.text()}`);
  });
  page.on("pageerror", (e) => console.log(`[page error] ${e}`));
  await page.goto(url);
  await page.waitForFunction(() => document.body.dataset.checkDone === "1", null, { timeout: 600_000, polling: 500 });
  const adapter = (await page.textContent("#adapter")).replace(/\s+/g, " ").trim();
  const summary = (await page.textContent("#check-summary")).trim();
  const family = (await page.textContent("#family-summary")).trim();
  console.log(`adapter: ${adapter}`);
  console.log(await page.textContent("#check-table"));
  console.log(summary);
  console.log(await page.textContent("#family-table"));
  const sentence = (await page.textContent("#sentence-status")).trim();
  console.log(`sentence: ${sentence}`);
  await page.click("#explorer button[type=submit]");
  await page.waitForFunction(() => /pass|FAIL|error/.test(document.getElementById("explorer-result").textContent), null, { timeout: 120_000 });
  const explored = (await page.textContent("#explorer-result")).trim();
  console.log(`explorer: ${explored.replace(/\s+/g, " ")}`);
  // The model that learns, trained in the page on the CPU backend (the same
  // model trains on the fused kernels natively: tests/gpu/backward.rs).
  await page.click("#train-run");
  await page.waitForFunction(() => document.getElementById("train-status").dataset.done === "1", null, { timeout: 300_000 });
  const trained = (await page.textContent("#train-status")).trim();
  console.log(`training: ${trained}`);
  if (process.env.WEBATTN_TRAIN_SCREENSHOT) {
    await page.locator("#train-panel").screenshot({ path: process.env.WEBATTN_TRAIN_SCREENSHOT });
  }
  await page.click("#timing-run");
  await page.waitForFunction(() => /faster|error/.test(document.getElementById("timing-status").textContent), null, { timeout: 600_000 });
  const timing = (await page.textContent("#timing-status")).trim();
  console.log(`timing: ${timing}`);
  const ok = (line) => /^\d+ passed, 0 failed$/.test(line) && !line.startsWith("0 ");
  if (!/No GPU/.test(adapter) || !/CPU backend \(f32/.test(adapter)) {
    console.error(`FAIL: the page did not fall back to the CPU backend: ${adapter}`);
  } else if (!ok(summary)) {
    console.error(`FAIL: the sweep on the CPU backend: ${summary}`);
  } else if (!ok(family)) {
    console.error(`FAIL: the family's checks on the CPU backend: ${family}`);
  } else if (!/^cpu path.* pass$/.test(sentence)) {
    console.error(`FAIL: the sentence on the CPU path: ${sentence}`);
  } else if (!explored.startsWith("path cpu: pass")) {
    console.error(`FAIL: the explorer: ${explored}`);
  } else if (!(Number(trained.match(/held-out loss ([\d.]+)/)?.[1] ?? NaN) < 0.1)) {
    console.error(`FAIL: the model did not learn (a held-out loss of 0.1 or more after its steps): ${trained}`);
  } else if (/error/.test(timing)) {
    console.error(`FAIL: the timing chart: ${timing}`);
  } else {
    failed = false;
  }
} catch (e) {
  console.error(`FAIL: ${e}`);
} finally {
  await context.close();
  server.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
console.log(`browser test without WebGPU: ${((Date.now() - started) / 1000).toFixed(1)} s`);
process.exit(failed ? 1 : 0);
