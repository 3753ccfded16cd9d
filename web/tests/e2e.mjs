// End-to-end test in a real browser: serves web/, opens the demo in Debian's
// headless Chromium (WebGPU on its SwiftShader adapter) with ?check=quick,
// waits for the conformance sweep to finish, and fails unless the page reads
// "N passed, 0 failed" with N > 0. Saves a screenshot of the heatmap.
//   node web/tests/e2e.mjs [screenshot.png]
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";
import { serve } from "../serve.mjs";

const screenshot = path.resolve(process.argv[2] ?? "web-heatmap.png");
const browserPath = process.env.CHROMIUM ?? "/usr/bin/chromium";
// The page's sweep, family checks and every kernel through Chrome's compiler,
// on SwiftShader: about 4 minutes here, most of it compiling pipelines (2-3 s
// each); the margin is for slower CI machines.
const TIMEOUT_MS = 540_000;

// Every kernel variant through Chrome's compiler takes 2-3 s each here (90
// of them): a sixth of them a run, on a rotation that WEBATTN_ROTATION (else
// the day) picks; the sweep's own pipelines compile in every run, and naga
// validates every variant natively (tests/gpu/translation.rs).
const turn = Number(process.env.WEBATTN_ROTATION ?? Math.floor(Date.now() / 86_400_000));
const share = `${turn % 6}/6`;
console.log(`rotation for the compiled variants: share ${share} (WEBATTN_ROTATION=${turn} repeats it)`);
const server = await serve(0);
const simd = process.env.WEBATTN_SIMD ? `&simd=${process.env.WEBATTN_SIMD}` : "";
const url = `http://127.0.0.1:${server.address().port}/?check=quick&compile=${share}${simd}`;
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "webattn-chromium-"));
const started = Date.now();
let failed = true;
const context = await chromium.launchPersistentContext(profile, {
  executablePath: browserPath,
  ignoreDefaultArgs: ["--headless"],
  args: [
    "--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking",
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
  await page.waitForFunction(() => document.body.dataset.checkDone === "1", null, { timeout: TIMEOUT_MS, polling: 500 });
  const adapter = await page.textContent("#adapter");
  const table = await page.textContent("#check-table");
  const summary = (await page.textContent("#check-summary")).trim();
  const compiled = (await page.textContent("#compile-summary")).trim();
  console.log(await page.textContent("#compile-table"));
  console.log(compiled);
  console.log(`adapter: ${adapter.replace(/\s+/g, " ").trim()}`);
  console.log(table);
  console.log(summary);
  const family = (await page.textContent("#family-summary")).trim();
  console.log(await page.textContent("#family-table"));
  await page.locator("#heatmap-panel").screenshot({ path: screenshot });
  console.log(`heatmap screenshot: ${screenshot}`);

  // Every scoring of the sentence example: each draws its weights and checks them.
  const variants = await page.$$eval("#sentence-variant option", (os) => os.map((o) => o.value));
  const drawn = [];
  for (const variant of variants) {
    await page.selectOption("#sentence-variant", variant);
    await page.waitForFunction(() => document.getElementById("sentence-status").dataset.done === "1", null, { timeout: 60_000 });
    const status = (await page.textContent("#sentence-status")).trim();
    console.log(`sentence ${variant}: ${status}`);
    drawn.push([variant, status]);
    if (variant === "bahdanau") {
      const shot = screenshot.replace(/\.png$/, "") + "-bahdanau.png";
      await page.locator("#heatmap-panel").screenshot({ path: shot });
      console.log(`Bahdanau heatmap screenshot: ${shot}`);
    }
  }

  // The explorer: the default settings (GQA, causal, Dk != Dv) on the fused path.
  await page.click("#explorer button[type=submit]");
  await page.waitForFunction(() => /pass|FAIL|error/.test(document.getElementById("explorer-result").textContent), null, { timeout: 60_000 });
  const explored = (await page.textContent("#explorer-result")).trim();
  console.log(`explorer: ${explored.replace(/\s+/g, " ")}`);
  // The timing chart.
  await page.click("#timing-run");
  await page.waitForFunction(() => /faster|seq|error/.test(document.getElementById("timing-status").textContent), null, { timeout: 120_000 });
  const timing = (await page.textContent("#timing-status")).trim();
  console.log(`timing: ${timing}`);
  if (process.env.WEBATTN_PAGE_SCREENSHOT) {
    await page.screenshot({ path: process.env.WEBATTN_PAGE_SCREENSHOT, fullPage: true });
  }
  const m = summary.match(/^(\d+) passed, (\d+) failed$/);
  if (!m) {
    console.error(`FAIL: the page's last line is not "N passed, N failed": ${summary}`);
  } else if (Number(m[1]) === 0 || Number(m[2]) !== 0) {
    console.error(`FAIL: ${summary}`);
  } else if (!/^\d+ kernels compiled, 0 failed( \(share \d+ of \d+\))?$/.test(compiled) || compiled.startsWith("0 ")) {
    console.error(`FAIL: the browser's shader compiler: ${compiled}`);
  } else if (!/^\d+ passed, 0 failed$/.test(family) || family.startsWith("0 ")) {
    console.error(`FAIL: the attention family's checks: ${family}`);
  } else if (drawn.some(([, status]) => !/ pass$/.test(status))) {
    console.error(`FAIL: a sentence heatmap: ${JSON.stringify(drawn.filter(([, s]) => !/ pass$/.test(s)))}`);
  } else if (!explored.startsWith("path fused: pass")) {
    console.error(`FAIL: the explorer: ${explored}`);
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
console.log(`browser test: ${((Date.now() - started) / 1000).toFixed(1)} s`);
process.exit(failed ? 1 : 0);
