// Benchmark (not a test): the CPU backend of the two wasm builds side by
// side in headless Chromium without WebGPU: SIMD128 (pkg/webattn_web_bg.wasm)
// and relaxed SIMD (pkg/webattn_web_relaxed_bg.wasm, which the library loads
// where the browser has it). The builds take turns, a fresh page each, for
// several rounds (this machine's speed drifts); prints a table, writes JSON.
//   bash web/build.sh && node web/tests/wasm-builds.mjs [seqs=512,1024] [rounds=3] [json=target/wasm-builds.json]
// WEBATTN_BUILDS_QUERY="&warmup=5&timed=7" (the defaults) sets the calls per page.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";
import { serve } from "../serve.mjs";

const [seqs = "512,1024", rounds = "3", json = "target/wasm-builds.json"] = process.argv.slice(2);
const server = await serve(0);
const base = `http://127.0.0.1:${server.address().port}/tests/wasm-builds.html?seqs=${seqs}${process.env.WEBATTN_BUILDS_QUERY ?? ""}`;
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "webattn-chromium-builds-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  ignoreDefaultArgs: ["--headless"],
  args: ["--headless=new", "--no-sandbox", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"],
});
const builds = [["simd128", "&simd=simd128"], ["relaxed-simd", "&simd=relaxed"]];
const runs = [];
try {
  for (let round = 0; round < Number(rounds); round++) {
    for (const [build, query] of builds) {
      const page = await context.newPage();
      await page.goto(base + query);
      const result = await page.waitForFunction(() => window.result, null, { timeout: 600_000, polling: 250 })
        .then((h) => h.jsonValue());
      await page.close();
      if (result.error) throw new Error(`${build}: ${result.error}`);
      if (!result.describe.includes(build)) throw new Error(`${build} asked, ${result.describe} ran`);
      runs.push({ round, build, describe: result.describe, rows: result.rows });
      console.error(`round ${round + 1}/${rounds}, ${build}: ${result.rows.map((r) => `${r.seq}: ${r.medianMs.toFixed(2)} ms`).join(", ")}`);
    }
  }
} finally {
  await context.close();
  server.close();
  fs.rmSync(profile, { recursive: true, force: true });
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
console.log("CPU backend in wasm, B1 H4 d64, one thread, the median of each page's timed calls after its warm-up; the builds take turns each round");
console.log(`${"seq".padStart(6)} ${"simd128 ms".padStart(22)} ${"relaxed-simd ms".padStart(22)} ${"relaxed / simd128 per round".padStart(30)}`);
const table = seqs.split(",").map(Number).map((seq) => {
  const of = (build) => runs.filter((r) => r.build === build).map((r) => r.rows.find((x) => x.seq === seq).medianMs);
  const plain = of("simd128"), relaxed = of("relaxed-simd");
  const ratios = relaxed.map((ms, i) => ms / plain[i]);
  const range = (xs) => `${median(xs).toFixed(2)} (${Math.min(...xs).toFixed(2)}-${Math.max(...xs).toFixed(2)})`;
  console.log(`${String(seq).padStart(6)} ${range(plain).padStart(22)} ${range(relaxed).padStart(22)} ${ratios.map((x) => x.toFixed(2)).join(" ").padStart(30)}`);
  return { seq, simd128_ms: plain, relaxed_simd_ms: relaxed, ratio_per_round: ratios };
});
fs.mkdirSync(path.dirname(json), { recursive: true });
fs.writeFileSync(json, JSON.stringify({ shape: "B1 H4 d64", browser: "headless Chromium, no WebGPU", runs, table }, null, 1));
console.log(`wrote ${json}`);
