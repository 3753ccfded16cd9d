// The demo page: the first user of the JavaScript library (./lib/webattn.js,
// the same module the npm tarball ships). The engine drives the browser's
// WebGPU adapter (or, without one, the fast CPU backend in wasm); every result
// is checked by the library's `verify` option against the f64 oracle in wasm.
import { WebAttn } from "./lib/webattn.js";
import { KEYS, QUERIES, normals, sentence } from "./sentence.js";

const $ = (id) => document.getElementById(id);
let engine = null;
let cpuEngine = null;
const hasGpu = () => engine.backend === "gpu";
/** A CPU-backend engine for the family's layers on the CPU path. */
async function cpu() {
  cpuEngine ??= await WebAttn.create({ backend: "cpu" });
  return cpuEngine;
}

// ---------------------------------------------------------------- heatmap

// Viridis, as a handful of stops interpolated linearly.
const VIRIDIS = [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142],
  [31, 158, 137], [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37]];
function colour(t) {
  const x = Math.min(Math.max(t, 0), 1) * (VIRIDIS.length - 1);
  const i = Math.min(Math.floor(x), VIRIDIS.length - 2);
  const f = x - i;
  const c = VIRIDIS[i].map((a, k) => Math.round(a + f * (VIRIDIS[i + 1][k] - a)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function drawScale(max) {
  const canvas = $("scale");
  const ctx = canvas.getContext("2d");
  for (let y = 0; y < canvas.height; y++) {
    ctx.fillStyle = colour(1 - y / (canvas.height - 1));
    ctx.fillRect(0, y, canvas.width, 1);
  }
  $("scale-max").textContent = max.toPrecision(3);
  $("scale-min").textContent = "0";
}

// Draws rows x cols values (row-major) with optional token labels; the cell
// under the cursor is read out in #hover.
function drawHeatmap({ values, rows, cols, rowLabels, colLabels, rowTitle, colTitle }) {
  const canvas = $("heatmap");
  const ctx = canvas.getContext("2d");
  const left = rowLabels ? 90 : 40, top = colLabels ? 90 : 30;
  const size = Math.max(1, Math.min((canvas.width - left - 10) / cols, (canvas.height - top - 10) / rows));
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  let max = 0;
  for (const v of values) max = Math.max(max, v);
  max = max > 0 ? max : 1;
  for (let i = 0; i < rows; i++) {
    for (let j = 0; j < cols; j++) {
      ctx.fillStyle = colour(values[i * cols + j] / max);
      ctx.fillRect(left + j * size, top + i * size, Math.ceil(size), Math.ceil(size));
    }
  }
  ctx.fillStyle = "#1d2330";
  ctx.font = "13px system-ui, sans-serif";
  if (rowLabels) {
    ctx.textAlign = "right";
    rowLabels.forEach((t, i) => ctx.fillText(t, left - 8, top + (i + 0.6) * size));
  } else {
    ctx.textAlign = "right";
    for (const i of [0, rows - 1]) ctx.fillText(String(i), left - 6, top + (i + 0.8) * size);
  }
  if (colLabels) {
    colLabels.forEach((t, j) => {
      ctx.save();
      ctx.translate(left + (j + 0.6) * size, top - 8);
      ctx.rotate(-Math.PI / 4);
      ctx.textAlign = "left";
      ctx.fillText(t, 0, 0);
      ctx.restore();
    });
  } else {
    ctx.textAlign = "center";
    for (const j of [0, cols - 1]) ctx.fillText(String(j), left + (j + 0.5) * size, top - 8);
  }
  ctx.fillStyle = "#5b6475";
  ctx.textAlign = "left";
  ctx.fillText(`${rowTitle} (rows) × ${colTitle} (columns)`, 4, 16);
  drawScale(max);
  canvas.onmousemove = (e) => {
    const r = canvas.getBoundingClientRect();
    const x = (e.clientX - r.left) * (canvas.width / r.width), y = (e.clientY - r.top) * (canvas.height / r.height);
    const j = Math.floor((x - left) / size), i = Math.floor((y - top) / size);
    if (i < 0 || j < 0 || i >= rows || j >= cols) return;
    const rl = rowLabels ? rowLabels[i] : `query ${i}`, cl = colLabels ? colLabels[j] : `key ${j}`;
    $("hover").textContent = `${rl} → ${cl}: ${values[i * cols + j].toFixed(4)}`;
  };
}

// ---------------------------------------------------------------- sections

function showAdapter() {
  const info = engine.adapter;
  const box = $("adapter");
  if (!info.gpu) {
    const why = navigator.gpu ? "the browser granted no WebGPU adapter" : "this browser has no navigator.gpu (WebGPU)";
    box.innerHTML = `<p class="warning">No GPU: ${why}. ${info.reason ?? ""}</p>
      <p>Everything below runs on the ${info.describe} in wasm instead, checked against the f64 oracle.</p>`;
    return;
  }
  const l = info.limits, f = info.features;
  const mib = (b) => `${Math.round(b / 1048576)} MiB`;
  box.innerHTML = `<div class="kv">
    <span>adapter</span><span>${info.name || "(unnamed)"} — ${info.backend}, ${info.deviceType}</span>
    <span>storage binding</span><span>${mib(l.maxStorageBufferBindingSize)} (buffer ${mib(l.maxBufferSize)})</span>
    <span>workgroup memory</span><span>${l.maxComputeWorkgroupStorageSize / 1024} KiB, ${l.maxComputeInvocationsPerWorkgroup} invocations</span>
    <span>features</span><span>subgroups ${f.subgroups ? `yes (${f.subgroupMinSize}–${f.subgroupMaxSize} wide)` : "no"},
      shader-f16 ${f.shaderF16 ? "yes" : "no"}, timestamps ${f.timestampQuery ? "yes" : "no"}</span>
    ${(info.plans || []).map((p) => `<span>${p.call}</span><span><code>${p.plan}</code></span>`).join("\n    ")}
  </div>`;
}

async function showSentence() {
  const path = hasGpu() ? $("sentence-path").value : "cpu";
  const variant = $("sentence-variant").value;
  const status = $("sentence-status");
  status.textContent = "running…";
  status.dataset.done = "";
  try {
    // On the CPU path the family's layers run on a CPU-backend engine.
    const on = path === "cpu" && variant !== "dot" ? await cpu() : engine;
    const r = await sentence(on, path, variant);
    drawHeatmap({
      values: r.heatmap, rows: QUERIES.length, cols: KEYS.length,
      rowLabels: QUERIES, colLabels: KEYS, rowTitle: "French queries", colTitle: "English keys",
    });
    $("heatmap-caption").textContent = `${r.caption} “Le chat était assis sur le tapis” attending to “The cat sat on the mat”; ` +
      "embeddings are made from the tokens, so this picture is the same on every load.";
    const c = r.check;
    status.innerHTML = `${r.path} path; worst error against the f64 oracle ${c.maxAbs.toExponential(2)} ` +
      `(allowed ${c.allowed.toExponential(2)}) <span class="${c.passed ? "pass" : "fail"}">${c.passed ? "pass" : "FAIL"}</span>`;
  } catch (e) {
    status.innerHTML = `<span class="fail">error:</span> ${e}`;
  }
  status.dataset.done = "1";
}

/** The explorer's settings, clamped as the form's limits say. */
function explorerSettings() {
  const form = new FormData($("explorer"));
  const num = (key, fallback, max) => Math.min(Math.max(Math.trunc(Number(form.get(key)) || fallback), 1), max);
  const seqQ = num("seq_q", 64, 512), seqK = num("seq_k", 64, 512), heads = num("heads", 4, 64);
  const dk = num("head_dim", 64, 256);
  return {
    seqQ, seqK, heads, kvHeads: num("kv_heads", heads, heads), dk, dv: num("v_head_dim", dk, 256),
    head: num("head", 1, heads) - 1, seed: Math.max(0, Math.trunc(Number(form.get("seed")) || 0)),
    mask: form.get("mask"), window: num("window", 8, 1 << 20), padding: Math.min(Math.max(Math.trunc(Number(form.get("padding")) || 0), 0), seqK),
    softcap: Number(form.get("softcap")) || 0, temperature: Number(form.get("temperature")) > 0 ? Number(form.get("temperature")) : 1,
    path: hasGpu() ? form.get("path") : (form.get("path") === "oracle" ? "oracle" : "cpu"),
  };
}

async function runExplorer(event) {
  event?.preventDefault();
  const s = explorerSettings();
  const out = $("explorer-result");
  out.textContent = "running…";
  try {
    const normal = normals(s.seed);
    const q = { data: normal(s.heads * s.seqQ * s.dk), shape: [1, s.heads, s.seqQ, s.dk] };
    const k = { data: normal(s.kvHeads * s.seqK * s.dk), shape: [1, s.kvHeads, s.seqK, s.dk] };
    const v = { data: normal(s.kvHeads * s.seqK * s.dv), shape: [1, s.kvHeads, s.seqK, s.dv] };
    const options = {
      softcap: s.softcap, temperature: s.temperature, qkMatmulOutputMode: 3, returnLse: true,
      path: s.path, timing: true, verify: true,
      isCausal: s.mask === "causal" || s.mask === "window",
      alibi: s.mask === "alibi", // in-kernel: -m_h |i - j| per head, no bias matrix uploaded
    };
    if (s.mask === "window") options.leftWindowSize = s.window;
    const inputs = { q, k, v };
    if (s.mask === "padding") inputs.nonpadKvSeqlen = [s.seqK - s.padding];
    const r = await engine.attention(inputs, options);
    const c = r.check, ms = (x) => (x == null ? "–" : `${x.toFixed(2)} ms`);
    const onGpu = r.path === "fused" || r.path === "unfused";
    out.innerHTML = `path ${r.path}: <span class="${c.passed ? "pass" : "fail"}">${c.passed ? "pass" : "FAIL"}</span>
Y: worst |${onGpu ? "GPU" : r.path} − f64 oracle| ${c.y.maxAbs.toExponential(2)}, allowed ${c.y.allowed.toExponential(2)}
probabilities: worst ${c.qkMatmulOutput.maxAbs.toExponential(2)}, allowed ${c.qkMatmulOutput.allowed.toExponential(2)}
${onGpu ? `GPU time ${ms(r.timing.gpuMs)} (call with upload and readback ${ms(r.timing.wallMs)})` : `${r.path} time ${ms(r.timing.wallMs)}`}; f64 oracle in wasm ${ms(c.oracleMs)}`;
    const cells = s.seqQ * s.seqK;
    drawHeatmap({ values: r.qkMatmulOutput.data.subarray(s.head * cells, (s.head + 1) * cells), rows: s.seqQ, cols: s.seqK, rowTitle: "queries", colTitle: `keys, head ${s.head + 1}` });
    $("sentence-status").textContent = "(showing the explorer's result; choose a path to see the sentence again)";
    $("heatmap-caption").textContent = `Explorer: probabilities of head ${s.head + 1} on the ${r.path} path ` +
      `(on the fused path they are recomputed tile by tile from Q, K and the row statistics).`;
  } catch (e) {
    out.innerHTML = `<span class="fail">error:</span> ${e.name}: ${e.message}`;
  }
}

async function runCheck(kind) {
  for (const b of [$("check-quick"), $("check-full")]) b.disabled = true;
  const bar = $("check-progress");
  bar.hidden = false;
  $("check-summary").textContent = "";
  $("check-table").textContent = "";
  const progress = (prefix) => (done, total, name, passed) => {
    bar.max = total;
    bar.value = done;
    $("check-current").textContent = `${prefix}${done}/${total} ${passed ? "" : "FAIL "}${name}`;
  };
  const summary = $("check-summary");
  try {
    const r = await engine.check(kind, progress(""));
    $("check-table").textContent = r.table;
    summary.textContent = r.summary;
    summary.className = `summary ${r.failed === 0 ? "pass" : "fail"}`;
    const f = await engine.check("family", progress("family "));
    $("family-table").textContent = f.table;
    const familySummary = $("family-summary");
    familySummary.textContent = f.summary;
    familySummary.className = `summary ${f.failed === 0 ? "pass" : "fail"}`;
    $("check-current").textContent = r.adapter;
  } catch (e) {
    summary.textContent = `error: ${e.name}: ${e.message}`;
    summary.className = "summary fail";
  } finally {
    for (const b of [$("check-quick"), $("check-full")]) b.disabled = false;
    document.body.dataset.checkDone = "1";
  }
}

// Compiles every pipeline variant with the browser's own WebGPU on a device
// that has `subgroups` (when the adapter offers it) and the adapter's limits.
async function compileKernels() {
  const table = $("compile-table"), summary = $("compile-summary");
  if (!navigator.gpu) {
    summary.textContent = "no WebGPU in this browser: nothing to compile";
    return;
  }
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) {
    summary.textContent = "no WebGPU adapter: nothing to compile";
    return;
  }
  const hasSubgroups = adapter.features.has("subgroups");
  const device = await adapter.requestDevice({
    requiredFeatures: hasSubgroups ? ["subgroups"] : [],
    requiredLimits: {
      maxComputeWorkgroupStorageSize: adapter.limits.maxComputeWorkgroupStorageSize,
      maxComputeInvocationsPerWorkgroup: adapter.limits.maxComputeInvocationsPerWorkgroup,
      maxStorageBuffersPerShaderStage: adapter.limits.maxStorageBuffersPerShaderStage,
    },
  });
  let passed = 0, failed = 0, skipped = 0;
  const lines = [];
  // `?compile=K/N`: only every N-th variant from the K-th (a share, as the
  // end-to-end test takes on a rotation); all of them by default.
  const [part, parts] = (new URLSearchParams(location.search).get("compile") ?? "0/1").split("/").map(Number);
  const share = Number.isInteger(part) && Number.isInteger(parts) && parts > 0 ? [part % parts, parts] : [0, 1];
  const sources = (await WebAttn.kernelSources()).filter((_, i) => i % share[1] === share[0]);
  for (const k of sources) {
    if (k.subgroups && !hasSubgroups) {
      skipped++;
      lines.push(`skip  ${k.label} (the adapter has no subgroups)`);
      continue;
    }
    device.pushErrorScope("validation");
    const module = device.createShaderModule({ code: k.code, label: k.label });
    const info = await module.getCompilationInfo();
    const errors = info.messages.filter((m) => m.type === "error").map((m) => `${m.lineNum}:${m.linePos} ${m.message}`);
    try {
      await device.createComputePipelineAsync({ layout: "auto", compute: { module, entryPoint: k.entry, constants: k.constants } });
    } catch (e) {
      errors.push(String(e.message ?? e));
    }
    const scoped = await device.popErrorScope();
    if (scoped) errors.push(scoped.message);
    if (errors.length === 0) {
      passed++;
      lines.push(`pass  ${k.label}`);
    } else {
      failed++;
      lines.push(`FAIL  ${k.label}: ${errors.join("; ")}`);
    }
  }
  device.destroy();
  table.textContent = lines.join("\n");
  const of = share[1] > 1 ? ` (share ${share[0]} of ${share[1]})` : "";
  summary.textContent = `${passed} kernels compiled, ${failed} failed${skipped ? `, ${skipped} skipped` : ""}${of}`;
  summary.className = `summary ${failed === 0 ? "pass" : "fail"}`;
}

function drawTiming(rows) {
  const canvas = $("timing");
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const paths = [["fused", "#1b7837"], ["unfused", "#2166ac"], ["cpu", "#b2182b"], ["oracle", "#999999"]]
    .filter(([p]) => rows.some((r) => r[p] != null));
  const max = Math.max(...rows.flatMap((r) => paths.map(([p]) => r[p] ?? 0)));
  const left = 60, bottom = canvas.height - 40, width = canvas.width - left - 130;
  const group = width / rows.length, bar = (group - 20) / paths.length;
  ctx.font = "12px system-ui, sans-serif";
  ctx.fillStyle = "#1d2330";
  rows.forEach((r, g) => {
    paths.forEach(([p, c], k) => {
      const v = r[p] ?? 0, h = (v / max) * (bottom - 20);
      ctx.fillStyle = c;
      ctx.fillRect(left + g * group + 10 + k * bar, bottom - h, bar - 2, h);
      ctx.fillStyle = "#1d2330";
      ctx.textAlign = "center";
      ctx.fillText(v.toFixed(v < 10 ? 1 : 0), left + g * group + 10 + (k + 0.5) * bar, bottom - h - 4);
    });
    ctx.fillText(`seq ${r.seq}`, left + (g + 0.5) * group, bottom + 18);
  });
  ctx.textAlign = "right";
  ctx.fillText("ms", left - 8, 24);
  paths.forEach(([p, c], k) => {
    ctx.fillStyle = c;
    ctx.fillRect(canvas.width - 110, 30 + k * 22, 14, 14);
    ctx.fillStyle = "#1d2330";
    ctx.textAlign = "left";
    ctx.fillText(p, canvas.width - 90, 42 + k * 22);
  });
}

/** Fused, unfused, CPU-backend and f64-oracle milliseconds at each sequence
 * length (B = 1, H = 4, d = 64): the median of 3 runs after one, the oracle one run. */
async function timing(seqs) {
  const rows = [];
  for (const seq of seqs) {
    const n = Math.min(Math.max(seq, 16), 2048);
    const shape = { batch: 1, heads: 4, seqQ: n, seqK: n, headDim: 64 };
    const row = { seq: n };
    for (const path of hasGpu() ? ["fused", "unfused", "cpu", "oracle"] : ["cpu", "oracle"]) {
      const repeats = path === "oracle" ? { warmup: 0, timed: 1 } : { warmup: 1, timed: 3 };
      row[path] = (await engine.benchmark(shape, { path, ...repeats })).medianMs;
    }
    rows.push(row);
  }
  return rows;
}

async function runTiming() {
  $("timing-run").disabled = true;
  $("timing-status").textContent = "measuring…";
  try {
    // ?timing=64,128,512 picks the sizes (the browser test measures larger ones).
    const asked = new URLSearchParams(location.search).get("timing");
    const seqs = asked ? asked.split(",").map(Number) : [64, 128, 256];
    const rows = await timing(seqs);
    drawTiming(rows);
    $("timing-status").textContent = rows.map((r) =>
      `seq ${r.seq}: ` + (r.fused ? `fused ${(r.unfused / r.fused).toFixed(1)}× faster than unfused, ` : "") +
      `CPU backend ${r.cpu.toFixed(1)} ms, ${(r.oracle / r.cpu).toFixed(1)}× faster than the f64 oracle (${r.oracle.toFixed(0)} ms)`).join("; ");
  } catch (e) {
    $("timing-status").textContent = `error: ${e}`;
  }
  $("timing-run").disabled = false;
}

// ---------------------------------------------------------------- training

/** The loss (red, from its first value down) and accuracy (blue, 0-100%) so far. */
function drawCurve(points, steps) {
  const canvas = $("train-curve");
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const left = 40, top = 10, w = canvas.width - 60, h = canvas.height - 50;
  ctx.strokeStyle = "#999";
  ctx.strokeRect(left, top, w, h);
  const max = Math.max(0.1, ...points.map((p) => p.loss));
  const line = (value, colour) => {
    ctx.strokeStyle = colour;
    ctx.beginPath();
    points.forEach((p, i) => {
      const x = left + (p.step / steps) * w, y = top + (1 - value(p)) * h;
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  };
  line((p) => p.loss / max, "#c0392b");
  line((p) => p.accuracy, "#2471a3");
  ctx.fillStyle = "#1d2330";
  ctx.font = "12px system-ui, sans-serif";
  ctx.fillText(`${steps} steps: loss (red, to ${max.toFixed(1)}), accuracy (blue, to 100%)`, left, top + h + 20);
}

/** Each head's attention from the question to the pairs; the asked pair boxed. */
function drawAttention(map, example) {
  const canvas = $("train-map");
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const [heads, n] = map.shape;
  const cell = 30, x0 = 10, y0 = 30;
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#1d2330";
  ctx.fillText("the question's attention, per head", x0, 14);
  for (let h = 0; h < heads; h++) {
    for (let t = 0; t < n; t++) {
      ctx.fillStyle = colour(map.data[(h * n + (n - 1)) * n + t]);
      ctx.fillRect(x0 + t * cell, y0 + h * cell, cell - 1, cell - 1);
    }
  }
  ctx.strokeStyle = "#000";
  ctx.lineWidth = 2;
  ctx.strokeRect(x0 + example.asked * cell, y0, cell - 1, heads * cell - 1);
  ctx.lineWidth = 1;
  ctx.fillStyle = "#1d2330";
  for (let t = 0; t < n; t++) {
    const label = t < example.keys.length ? `${example.keys[t]}:${example.values[t]}` : "?";
    ctx.fillText(label, x0 + t * cell + 2, y0 + heads * cell + 14);
  }
}

async function runTraining() {
  const steps = 100;
  $("train-run").disabled = true;
  const status = $("train-status");
  status.dataset.done = "0";
  const points = [];
  const started = performance.now();
  try {
    const out = await engine.trainRecall({ steps }, async (p) => {
      points.push(p);
      if (p.step % 10 === 0) {
        drawCurve(points, steps);
        status.textContent = `step ${p.step}: loss ${p.loss.toFixed(3)}, accuracy ${(100 * p.accuracy).toFixed(0)}%`;
        await new Promise((resolve) => setTimeout(resolve, 0));
      }
    });
    drawCurve(out.curve, steps);
    drawAttention(out.map, out.example);
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    status.textContent = `trained ${steps} steps in ${seconds} s: held-out loss ${out.heldOut.loss.toFixed(3)}, ` +
      `accuracy ${(100 * out.heldOut.accuracy).toFixed(0)}% (chance: 6%)`;
  } catch (e) {
    status.textContent = `error: ${e}`;
  }
  status.dataset.done = "1";
  $("train-run").disabled = false;
}

// ---------------------------------------------------------------- start

async function main() {
  // The demo shows the WebGPU kernels: on the adapter wherever one exists,
  // even a CPU implementation that an engine left to choose would pass over.
  // ?simd=relaxed|simd128 picks the wasm build (the library's choice else).
  const simd = new URLSearchParams(location.search).get("simd") ?? "auto";
  engine = await WebAttn.create({ backend: "gpu", simd }).catch(() => WebAttn.create({ simd }));
  showAdapter();
  $("sentence-path").onchange = showSentence;
  $("sentence-variant").onchange = showSentence;
  $("explorer").onsubmit = runExplorer;
  $("check-quick").onclick = async () => { await compileKernels(); await runCheck("quick"); };
  $("check-full").onclick = async () => { await compileKernels(); await runCheck("full"); };
  $("timing-run").onclick = runTiming;
  $("train-run").onclick = runTraining;
  await showSentence();
  document.body.dataset.ready = "1";
  // Compile the explorer's pipelines for its default settings while the page
  // is read, so its first click does not wait for them (seconds on a CPU
  // adapter); calls made meanwhile queue behind it.
  if (hasGpu()) {
    const s = explorerSettings();
    engine.warmup([{ q: [1, s.heads, s.seqQ, s.dk], k: [1, s.kvHeads, s.seqK, s.dk], v: [1, s.kvHeads, s.seqK, s.dv] }],
      { isCausal: s.mask === "causal", qkMatmulOutputMode: 3, returnLse: true, path: s.path === "unfused" ? "unfused" : "fused" })
      .catch((e) => console.warn(`warmup: ${e.name}: ${e.message}`));
  }
  const check = new URLSearchParams(location.search).get("check");
  if (check === "quick" || check === "full") {
    await compileKernels();
    await runCheck(check);
  }
}

main().catch((e) => {
  $("adapter").innerHTML = `<p class="warning">The demo failed to start: ${e}</p>`;
  $("check-summary").textContent = `error: ${e}`;
  document.body.dataset.checkDone = "1";
});
