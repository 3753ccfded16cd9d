// The library's test suite, run in a page and in a Web Worker (no DOM use).
// Imports the module from the packed tarball (served at /webattn/), drives
// every call of the public API on the caller's own typed arrays, and checks
// results against the f64 oracle (the `verify` option, computed in the page
// in wasm) and against a small JavaScript f64 reference written here.
import { WebAttn, DeviceTensor, PreparedCall } from "/webattn/webattn.js";

// ------------------------------------------------------------------ helpers

/** SplitMix64 normals, so every run sees the same inputs. */
function rng(seed) {
  let state = BigInt(seed);
  const M = (1n << 64n) - 1n;
  const next = () => {
    state = (state + 0x9e3779b97f4a7c15n) & M;
    let z = state;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M;
    return z ^ (z >> 31n);
  };
  const unit = () => Number(next() >> 11n) / 2 ** 53;
  return (n, scale = 1) => {
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      const u1 = Math.max(unit(), 1e-300), u2 = unit();
      out[i] = scale * Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
    }
    return out;
  };
}

const size = (shape) => shape.reduce((a, b) => a * b, 1);
const tensor = (normal, shape, scale = 1) => ({ data: normal(size(shape), scale), shape });

/** Plain f64 attention for [B, H, N, D] (GQA, optional bool mask [Nq, Nk], causal). */
function reference({ q, k, v, mask, causal = false, scale }) {
  const [B, H, Nq, D] = q.shape, [, Hk, Nk] = k.shape, Dv = v.shape[3];
  const s = scale ?? 1 / Math.sqrt(D);
  const y = new Float64Array(B * H * Nq * Dv);
  for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) {
    const hk = Math.floor(h / (H / Hk));
    for (let i = 0; i < Nq; i++) {
      const scores = new Float64Array(Nk).fill(-Infinity);
      for (let j = 0; j < Nk; j++) {
        if (causal && j > i + (Nk - Nq)) continue;
        if (mask && !mask.data[i * Nk + j]) continue;
        let dot = 0;
        for (let d = 0; d < D; d++) dot += q.data[((b * H + h) * Nq + i) * D + d] * k.data[((b * Hk + hk) * Nk + j) * D + d];
        scores[j] = dot * s;
      }
      const max = Math.max(...scores);
      if (max === -Infinity) continue; // a fully masked row is zero
      let sum = 0;
      for (let j = 0; j < Nk; j++) sum += (scores[j] = Math.exp(scores[j] - max));
      for (let j = 0; j < Nk; j++) {
        const p = scores[j] / sum;
        for (let d = 0; d < Dv; d++) y[((b * H + h) * Nq + i) * Dv + d] += p * v.data[((b * Hk + hk) * Nk + j) * Dv + d];
      }
    }
  }
  return y;
}

const maxDiff = (a, b) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);

/** f32 to IEEE half bits (round to nearest even; normals and zero are all the tests need). */
function halfBits(x) {
  const f = new Float32Array([x]), u = new Uint32Array(f.buffer)[0];
  const sign = (u >>> 16) & 0x8000, exp = ((u >>> 23) & 0xff) - 127 + 15, man = u & 0x7fffff;
  if (exp <= 0) return sign;
  let h = sign | (exp << 10) | (man >>> 13);
  const rest = man & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (h & 1))) h++;
  return h;
}
function halfValue(bits) {
  const e = (bits >> 10) & 0x1f, m = bits & 0x3ff, s = bits & 0x8000 ? -1 : 1;
  return e === 0 ? s * m * 2 ** -24 : s * (1 + m / 1024) * 2 ** (e - 15);
}

/** Runs `fn`, expecting a rejection named `name` whose message matches `pattern`. */
async function rejects(fn, name, pattern) {
  try {
    await fn();
  } catch (e) {
    if (!(e instanceof Error)) throw new Error(`rejected with a non-Error: ${e}`);
    if (e.name !== name) throw new Error(`rejected as ${e.name} (${e.message}), expected ${name}`);
    if (pattern && !pattern.test(e.message)) throw new Error(`message "${e.message}" does not match ${pattern}`);
    return e.message;
  }
  throw new Error(`resolved; expected a ${name} rejection`);
}

function expect(cond, message) {
  if (!cond) throw new Error(message);
}

function expectVerified(r, what) {
  expect(r.check, `${what}: no check in the result`);
  expect(r.check.passed, `${what}: outside tolerance ${JSON.stringify(r.check)}`);
  const y = r.check.y ?? r.check.output;
  return `worst ${y.maxAbs.toExponential(2)} of ${y.allowed.toExponential(2)}`;
}

// ------------------------------------------------------------------ cases

function cases({ worker, isa }) {
  const list = [];
  const add = (name, fn) => list.push({ name, fn });
  const n = rng(7);

  add("create and adapter", async (engine) => {
    const a = engine.adapter;
    expect(typeof a.describe === "string" && a.describe.length > 0, "no description");
    expect(a.gpu === (engine.backend === "gpu"), "adapter.gpu and backend disagree");
    if (a.gpu) expect(a.limits.maxStorageBufferBindingSize > 0 && a.features && a.plans.length > 0 && a.plans.every((p) => p.plan.length > 0), "no limits/features/plans");
    if (a.gpu) expect(a.name.length > 0 && !a.describe.startsWith(" "), `the adapter has no name: ${JSON.stringify(a.describe)}`);
    if (a.gpu) expect(["attention_tiled", "attention_sg", "attention_fused"].includes(a.fusedKernel), `fused kernel ${a.fusedKernel}`);
    return `${engine.backend}: ${a.describe}${a.gpu ? ` (vendor ${a.vendor}, architecture ${a.architecture}; fused: ${a.fusedKernel})` : ""}`;
  });

  add("the README's example", async () => {
    const engine = await WebAttn.create();
    const shape = [1, 8, 128, 64];
    const q = { data: new Float32Array(8 * 128 * 64).fill(0.1), shape };
    const { y, path } = await engine.attention({ q, k: q, v: q }, { isCausal: true });
    expect(y.shape.join() === shape.join() && Math.abs(y.data[0] - 0.1) < 1e-6, `y ${y.shape} ${y.data[0]}`);
    const checked = await engine.attention({ q, k: q, v: q }, { verify: true });
    expect(checked.check.y.passed, "not verified");
    // A browser has no matrix units: "fast" runs the f32 kernels, and verifies.
    const fast = await engine.attention({ q, k: q, v: q }, { precision: "fast", verify: true });
    expect(fast.check.y.passed, "precision fast not verified");
    engine.destroy();
    return `${path}, y[0] = ${y.data[0]}`;
  });

  add("attention on typed arrays matches a JS f64 reference and the oracle (sizes 1, 7, 97, GQA)", async (engine) => {
    const lines = [];
    for (const [B, H, Hk, Nq, Nk, D] of [[1, 1, 1, 1, 1, 8], [1, 4, 2, 7, 97, 40], [2, 3, 1, 97, 7, 64]]) {
      const q = tensor(n, [B, H, Nq, D]), k = tensor(n, [B, Hk, Nk, D]), v = tensor(n, [B, Hk, Nk, D]);
      const r = await engine.attention({ q, k, v }, { verify: true });
      expect(r.y.data instanceof Float32Array, "y is not a Float32Array");
      expect(JSON.stringify(r.y.shape) === JSON.stringify([B, H, Nq, D]), `y shape ${r.y.shape}`);
      const diff = maxDiff(r.y.data, reference({ q, k, v }));
      expect(diff < 1e-5, `differs from the JS reference by ${diff}`);
      lines.push(`${B}x${H}/${Hk}x${Nq}x${Nk}x${D} ${r.path} ${expectVerified(r, "attention")}`);
    }
    return lines.join("; ");
  });

  add("every mask form and option within tolerance of the oracle", async (engine) => {
    const [B, H, Nq, Nk, D] = [2, 2, 33, 65, 32];
    const q = tensor(n, [B, H, Nq, D]), k = tensor(n, [B, H, Nk, D]), v = tensor(n, [B, H, Nk, D]);
    const bool = new Uint8Array(Nq * Nk).map((_, i) => (i % 5 !== 0 ? 1 : 0));
    bool.fill(0, 3 * Nk, 4 * Nk); // row 3 fully masked
    const additive = n(Nq * Nk, 2);
    const variants = [
      ["bool mask (fully masked row)", { mask: { data: bool, shape: [1, 1, Nq, Nk] } }, {}],
      ["boolean[] mask", { mask: { data: Array.from(bool, (b) => b === 1), shape: [Nq, Nk] } }, {}],
      ["additive mask", { mask: { data: additive, shape: [Nq, Nk] } }, {}],
      ["causal", {}, { isCausal: true }],
      ["windows", {}, { leftWindowSize: 5, rightWindowSize: 3 }],
      ["nonpad lengths", { nonpadKvSeqlen: new BigInt64Array([20n, 65n]) }, {}],
      ["softcap + scale", {}, { softcap: 3, scale: 0.5 }],
      ["ALiBi + temperature", {}, { alibi: true, temperature: 0.7, isCausal: true }],
      ["probabilities + lse", {}, { qkMatmulOutputMode: 3, returnLse: true }],
      ["large logits", {}, { scale: 3 }],
    ];
    const lines = [];
    for (const [label, extra, options] of variants) {
      const r = await engine.attention({ q, k, v, ...extra }, { ...options, verify: true });
      lines.push(`${label}: ${expectVerified(r, label)}`);
      if (options.returnLse) {
        expect(r.lse && r.qkMatmulOutput, "lse or probabilities missing");
        expect(JSON.stringify(r.qkMatmulOutput.shape) === JSON.stringify([B, H, Nq, Nk]), "probabilities shape");
      } else {
        expect(r.lse === undefined && r.qkMatmulOutput === undefined, "outputs that were not asked for came back");
      }
    }
    // The fully masked row is zero, as PyTorch's.
    const r = await engine.attention({ q, k, v, mask: { data: bool, shape: [Nq, Nk] } });
    expect(r.y.data.slice(3 * D, 4 * D).every((x) => x === 0), "fully masked row is not zero");
    return lines.join("; ");
  });

  add("every path agrees with the oracle", async (engine) => {
    const q = tensor(n, [1, 2, 97, 64]), k = tensor(n, [1, 2, 257, 64]), v = tensor(n, [1, 2, 257, 64]);
    const paths = engine.backend === "gpu" ? ["fused", "unfused", "cpu", "oracle"] : ["cpu", "oracle"];
    const lines = [];
    for (const path of paths) {
      const r = await engine.attention({ q, k, v }, { path, isCausal: true, verify: true });
      expect(r.path === path, `asked for ${path}, ran ${r.path}`);
      lines.push(`${path} ${expectVerified(r, path)}`);
    }
    if (engine.backend === "cpu") await rejects(() => engine.attention({ q, k, v }, { path: "fused" }), "Conflict", /GPU path/);
    return lines.join("; ");
  });

  add("the backward pass: gradients of a forward call within tolerance of the oracle's", async (engine) => {
    const lines = [];
    const q = tensor(n, [1, 4, 33, 16]), k = tensor(n, [1, 2, 40, 16]), v = tensor(n, [1, 2, 40, 8]);
    const paths = engine.backend === "gpu" ? ["fused", "cpu"] : ["cpu"];
    for (const [label, options] of [["causal", { isCausal: true }], ["softcap + ALiBi", { softcap: 3, alibi: true }]]) {
      const fwd = await engine.attention({ q, k, v }, { ...options, returnLse: true });
      const dy = tensor(n, fwd.y.shape);
      for (const path of paths) {
        const g = await engine.attentionBackward({ q, k, v }, { y: fwd.y, lse: fwd.lse, dy }, { ...options, path, verify: true });
        expect(g.path === path, `asked for ${path}, ran ${g.path}`);
        expect(g.dq.shape.join() === q.shape.join() && g.dk.shape.join() === k.shape.join() && g.dv.shape.join() === v.shape.join(), "gradient shapes");
        expect(g.check.passed, `${label} on ${path}: outside tolerance ${JSON.stringify(g.check)}`);
        lines.push(`${label} ${path}: worst ${g.check.worstOutput} ${g.check.maxAbs.toExponential(2)} of ${g.check.allowed.toExponential(2)}`);
      }
    }
    await rejects(() => engine.attentionBackward({ q, k, v }, { y: q, lse: q, dy: q }), "ShapeMismatch", /Y/);
    return lines.join("; ");
  });

  add("packed sequences (attentionRagged) equal each sequence's own call", async (engine) => {
    const [qLens, kLens] = [[5, 1, 13], [9, 4, 13]];
    const offsets = (lens) => Int32Array.from([0, ...lens.map((_, i) => lens.slice(0, i + 1).reduce((a, b) => a + b))]);
    const [cuQ, cuK] = [offsets(qLens), offsets(kLens)];
    const [hq, hkv, d] = [4, 2, 16];
    const q = tensor(n, [cuQ[3], hq, d]), k = tensor(n, [cuK[3], hkv, d]), v = tensor(n, [cuK[3], hkv, d]);
    const options = { isCausal: true, softcap: 5, returnLse: true };
    const r = await engine.attentionRagged({ q, k, v, cuSeqlensQ: cuQ, cuSeqlensK: cuK }, options);
    expect(r.y.shape.join() === [cuQ[3], hq, d].join() && r.lse.shape.join() === [cuQ[3], hq].join(), "packed shapes");
    // Sequence i alone, [1, H, rows, d], from the packed [rows, H, d].
    const unpack = (t, from, to) => {
      const [heads, width] = [t.shape[1], t.shape[2]];
      const data = new Float32Array((to - from) * heads * width);
      for (let r = from; r < to; r++) for (let h = 0; h < heads; h++) for (let x = 0; x < width; x++) {
        data[(h * (to - from) + r - from) * width + x] = t.data[(r * heads + h) * width + x];
      }
      return { data, shape: [1, heads, to - from, width] };
    };
    let worst = 0;
    for (let i = 0; i < 3; i++) {
      const alone = await engine.attention({ q: unpack(q, cuQ[i], cuQ[i + 1]), k: unpack(k, cuK[i], cuK[i + 1]), v: unpack(v, cuK[i], cuK[i + 1]) }, options);
      worst = Math.max(worst, maxDiff(unpack(r.y, cuQ[i], cuQ[i + 1]).data, alone.y.data));
    }
    expect(worst <= 1e-6, `packed and alone differ by ${worst}`);
    await rejects(() => engine.attentionRagged({ q, k, v, cuSeqlensQ: [0, 5, 6], cuSeqlensK: cuK }), "InvalidOption", /cuSeqlensQ/);
    await rejects(() => engine.attentionRagged({ q, k, v, cuSeqlensQ: cuQ }), "MissingInput", /cuSeqlensK/);
    return `3 sequences, worst difference from each alone ${worst}`;
  });

  add("a paged KV cache (pagedCache): each sequence's pages attend as its own call", async (engine) => {
    const [hq, hkv, d] = [4, 2, 16];
    const cache = engine.pagedCache({ kvHeads: hkv, headDim: d, pageSize: 16 });
    const rows = (len) => ({ k: tensor(n, [hkv, len, d]), v: tensor(n, [hkv, len, d]) });
    const prompt = await cache.addSequence();
    await cache.append([{ seq: prompt, ...rows(20) }]); // a page and 4 tokens of a second
    const beam = await cache.fork(prompt);
    const own = await cache.addSequence();
    await cache.append([{ seq: beam, ...rows(1) }, { seq: own, ...rows(37) }]);
    const usage = cache.usage();
    expect(cache.length(beam) === 21 && cache.length(own) === 37, "lengths");
    expect(usage.sequences === 3 && usage.pagesInUse === 6, `pages: ${JSON.stringify(usage)}`);
    expect(cache.blockTable(beam)[0] === cache.blockTable(prompt)[0] && cache.blockTable(beam)[1] !== cache.blockTable(prompt)[1], "the fork shares its full page and copied the last");
    // Two decode rows, a few rows of a prompt: one call.
    const queries = [[beam, 1], [own, 5], [prompt, 1]].map(([seq, rowsAsked]) => ({ seq, q: tensor(n, [1, hq, rowsAsked, d]) }));
    const options = { isCausal: true, softcap: 5, returnLse: true };
    const out = await cache.attention(queries, options);
    let worst = 0;
    for (let i = 0; i < queries.length; i++) {
      const { k, v } = await cache.read(queries[i].seq);
      const alone = await engine.attention({ q: queries[i].q, k, v, nonpadKvSeqlen: [k.shape[2]] }, options);
      worst = Math.max(worst, maxDiff(out[i].y.data, alone.y.data), maxDiff(out[i].lse.data, alone.lse.data));
    }
    expect(worst <= 1e-5, `paged and alone differ by ${worst}`);
    await cache.free(prompt);
    expect(cache.usage().pagesInUse === 5, "the prompt's own page freed, its first still the beam's");
    await rejects(() => cache.append([{ seq: prompt, ...rows(1) }]), "Paged", /not in this cache/);
    await rejects(() => cache.attention([{ seq: own, q: tensor(n, [1, hq, 40, d]) }]), "ShapeMismatch", /query/);
    await rejects(() => cache.append([{ seq: own, k: tensor(n, [3, 1, d]), v: tensor(n, [3, 1, d]) }]), "ShapeMismatch", /heads/);
    expect(cache.length(own) === 37, "a refused append changed the sequence");
    cache.dispose();
    // f16 pages: half the bytes, attention on the rounded values as stored.
    const halves = engine.pagedCache({ kvHeads: hkv, headDim: d, storage: "f16" });
    const seq = await halves.addSequence();
    await halves.append([{ seq, ...rows(37) }]);
    const q = tensor(n, [1, hq, 2, d]);
    const [half] = await halves.attention([{ seq, q }], options);
    const stored = await halves.read(seq);
    const alone = await engine.attention({ q, k: stored.k, v: stored.v, nonpadKvSeqlen: [37] }, options);
    const halfDiff = maxDiff(half.y.data, alone.y.data);
    expect(halfDiff <= 1e-5, `f16 pages and alone differ by ${halfDiff}`);
    expect(halves.usage().storage === "f16" && halves.usage().bytes * 2 === usage.bytes * halves.usage().pages / usage.pages, `f16 bytes: ${JSON.stringify(halves.usage())}`);
    halves.dispose();
    // int8 pages: a byte a value and a scale a row, attention on the dequantized values.
    const bytes = engine.pagedCache({ kvHeads: hkv, headDim: d, storage: "int8" });
    const seq8 = await bytes.addSequence();
    await bytes.append([{ seq: seq8, ...rows(37) }]);
    const [eight] = await bytes.attention([{ seq: seq8, q }], options);
    const held = await bytes.read(seq8);
    const alone8 = await engine.attention({ q, k: held.k, v: held.v, nonpadKvSeqlen: [37] }, options);
    const int8Diff = maxDiff(eight.y.data, alone8.y.data);
    expect(int8Diff <= 1e-5, `int8 pages and alone differ by ${int8Diff}`);
    const perPage = (u) => u.bytes / u.pages;
    expect(bytes.usage().storage === "int8" && perPage(bytes.usage()) * 4 * d === perPage(usage) * (d + 4), `int8 bytes: ${JSON.stringify(bytes.usage())}`);
    bytes.dispose();
    return `3 sequences in ${usage.onDevice ? "device" : "host"} pages, worst difference from each alone ${worst.toExponential(2)}; f16 pages ${halfDiff.toExponential(2)}; int8 pages ${int8Diff.toExponential(2)}`;
  });

  add("f16 inputs (Float16Array and Uint16Array bits)", async (engine) => {
    const shape = [1, 2, 9, 16];
    const values = () => Array.from({ length: size(shape) }, (_, i) => ((i * 37) % 97 - 48) / 32);
    const bits = (a) => Uint16Array.from(a, halfBits);
    const [qv, kv, vv] = [values(), values().reverse(), values().map((x) => x / 2)];
    const asF32 = (a) => ({ data: Float32Array.from(bits(a), halfValue), shape });
    // f16 inputs are computed in f32 and Y (typed by Q) comes back f16: the
    // f32 call's Y rounded to f16.
    const round = Math.f16round ?? ((x) => halfValue(halfBits(x)));
    const want = await engine.attention({ q: asF32(qv), k: asF32(kv), v: asF32(vv) });
    expect(want.y.dtype === "float32", `f32 queries gave ${want.y.dtype}`);
    const wantHalf = want.y.data.map(round);
    const fromBits = await engine.attention({ q: { data: bits(qv), shape }, k: { data: bits(kv), shape }, v: { data: bits(vv), shape, dtype: "float16" } });
    expect(fromBits.y.dtype === "float16", `f16 queries gave ${fromBits.y.dtype}`);
    expect(maxDiff(fromBits.y.data, wantHalf) === 0, "Uint16Array f16 differs from the same values in f32, rounded");
    // f32 data with dtype "float16" is stored as f16 too.
    const asked = await engine.attention({ q: { data: Float32Array.from(bits(qv), halfValue), shape, dtype: "float16" }, k: asF32(kv), v: asF32(vv) });
    expect(asked.y.dtype === "float16" && maxDiff(asked.y.data, wantHalf) === 0, "dtype float16 on f32 data");
    let half = "no Float16Array in this browser";
    if (typeof Float16Array === "function") {
      const h = (a) => ({ data: Float16Array.from(a), shape });
      const r = await engine.attention({ q: h(qv), k: h(kv), v: h(vv) }, { verify: true });
      expect(maxDiff(r.y.data, wantHalf) === 0, "Float16Array differs from the same values in f32, rounded");
      half = `Float16Array ${expectVerified(r, "f16")}`;
    }
    // Decode reads f16 keys and values in place (the queries, f32, are not widened).
    if (engine.adapter.gpu) {
      const [qs, ks] = [[1, 4, 1, 64], [1, 2, 1025, 64]];
      const n16 = (s) => ({ data: Float32Array.from(n(size(s)), round), shape: s, dtype: "float16" });
      const inputs = { q: tensor(n, qs), k: n16(ks), v: n16(ks) };
      await engine.attention(inputs, { path: "fused" });
      expect(engine.lastCall.widenedBytes === 0, `decode widened ${engine.lastCall.widenedBytes} bytes`);
      // (verify runs the oracle after the call, so it checks a second call)
      const r = await engine.attention(inputs, { path: "fused", verify: true });
      half += `; decode in place ${expectVerified(r, "f16 decode")}`;
    }
    return `Uint16Array bits equal f32 rounded; ${half}`;
  });

  add("bfloat16 inputs (Uint16Array bits with dtype bfloat16)", async (engine) => {
    const shape = [1, 2, 9, 16];
    // Values bfloat16 holds exactly (6 significant bits), and their bits: the upper half of an f32's.
    const values = (salt) => Float32Array.from({ length: size(shape) }, (_, i) => (((i + salt) * 37) % 97 - 48) / 32);
    const bf16 = (a) => Uint16Array.from(new Uint32Array(a.buffer), (b) => b >>> 16);
    const [qv, kv, vv] = [values(0), values(5), values(11)];
    const want = await engine.attention({ q: { data: qv, shape }, k: { data: kv, shape }, v: { data: vv, shape } });
    const t = (a) => ({ data: bf16(a), shape, dtype: "bfloat16" });
    const got = await engine.attention({ q: t(qv), k: t(kv), v: t(vv) }, { verify: true });
    expect(got.y.dtype === "float32", `bfloat16 queries gave ${got.y.dtype}`);
    expect(maxDiff(got.y.data, want.y.data) === 0, "bfloat16 bits differ from the same values in f32");
    await rejects(() => engine.attention({ q: { data: qv, shape, dtype: "bfloat16" }, k: t(kv), v: t(vv) }), "DType", /bfloat16 bits/);
    // Uploaded as bits and widened on the device (on a GPU engine): the same f32 values, the same call.
    const [dq, dk, dv] = [await engine.upload(t(qv)), await engine.upload(t(kv)), await engine.upload(t(vv))];
    expect(maxDiff((await dk.read()).data, kv) === 0, "an uploaded bfloat16 tensor reads back other values");
    const onDevice = await engine.attention({ q: dq, k: dk, v: dv });
    expect(maxDiff(onDevice.y.data, want.y.data) === 0, "bfloat16 device tensors differ from the same values in f32");
    for (const d of [dq, dk, dv]) d.dispose();
    await rejects(() => engine.upload({ data: new Uint16Array(5), shape, dtype: "bfloat16" }), "DataLength");
    return `bfloat16 bits equal the f32 values, uploaded too; ${expectVerified(got, "bfloat16")}`;
  });

  add("3-D inputs with qNumHeads/kvNumHeads; past key/value and present outputs", async (engine) => {
    const [B, S, H, Hk, D] = [2, 11, 4, 2, 16];
    const q = tensor(n, [B, S, H * D]), k = tensor(n, [B, 13, Hk * D]), v = tensor(n, [B, 13, Hk * D]);
    const r = await engine.attention({ q, k, v }, { qNumHeads: H, kvNumHeads: Hk, verify: true });
    expect(JSON.stringify(r.y.shape) === JSON.stringify([B, S, H * D]), `3-D y shape ${r.y.shape}`);
    await rejects(() => engine.attention({ q, k, v }), "InvalidOption", /qNumHeads/);
    // A head count past 2^32 is refused, not wrapped (2^32 + 4 would read as 4 on wasm32).
    await rejects(() => engine.attention({ q, k, v }, { qNumHeads: 2 ** 32 + H, kvNumHeads: Hk }), "InvalidOption", /qNumHeads/);
    // f16 3-D inputs stay f16, as 4-D ones do: Y comes back float16.
    const half = (t) => ({ ...t, dtype: "float16" });
    const r16 = await engine.attention({ q: half(q), k: half(k), v: half(v) }, { qNumHeads: H, kvNumHeads: Hk });
    expect(r16.y.dtype === "float16" && JSON.stringify(r16.y.shape) === JSON.stringify([B, S, H * D]), `3-D f16 y: ${r16.y.dtype} ${r16.y.shape}`);
    const past = { pastKey: tensor(n, [B, Hk, 5, D]), pastValue: tensor(n, [B, Hk, 5, D]) };
    const q4 = tensor(n, [B, H, 3, D]), k4 = tensor(n, [B, Hk, 3, D]), v4 = tensor(n, [B, Hk, 3, D]);
    const p = await engine.attention({ q: q4, k: k4, v: v4, ...past }, { isCausal: true, returnPresent: true, verify: true });
    expect(JSON.stringify(p.presentKey.shape) === JSON.stringify([B, Hk, 8, D]), `presentKey shape ${p.presentKey.shape}`);
    expect(p.presentValue.data.slice(0, 5 * D).every((x, i) => x === past.pastValue.data[i]), "presentValue does not start with pastValue");
    return `3-D ${expectVerified(r, "3-D")}; past ${expectVerified(p, "past")}`;
  });

  add("prepared calls: runs equal plain calls, options fixed at prepare, other shapes refused", async (engine) => {
    // One query row over 600 keys (a decoder step: the decode route on a GPU).
    const shapes = { q: [1, 4, 1, 32], k: [1, 2, 600, 32], v: [1, 2, 600, 32] };
    const options = { scale: 0.3 };
    const first = { q: tensor(n, shapes.q), k: tensor(n, shapes.k), v: tensor(n, shapes.v) };
    const prepared = await engine.prepare(first, options);
    expect(prepared instanceof PreparedCall && typeof prepared.path === "string", "prepare did not give a PreparedCall");
    expect(prepared.plan.startsWith(prepared.path), `prepared.plan: ${prepared.plan}`);
    let worst = "";
    for (let run = 0; run < 3; run++) {
      const inputs = { q: tensor(n, shapes.q), k: tensor(n, shapes.k), v: tensor(n, shapes.v) };
      const got = await prepared.run(inputs, { verify: true });
      const want = await engine.attention(inputs, options);
      expect(got.path === prepared.path, `ran ${got.path}, prepared ${prepared.path}`);
      expect(maxDiff(got.y.data, want.y.data) === 0, `run ${run} differs from a plain call`);
      worst = expectVerified(got, `prepared run ${run}`);
    }
    const kept = await prepared.run(first, { keepOnDevice: true });
    expect(kept.y instanceof DeviceTensor, "keepOnDevice did not keep");
    kept.y.dispose();
    await rejects(() => prepared.run(first, { isCausal: false }), "InvalidOption", /prepared/);
    await rejects(() => prepared.run({ ...first, k: tensor(n, [1, 2, 601, 32]), v: tensor(n, [1, 2, 601, 32]) }), "Conflict", /prepared/);
    await rejects(() => engine.prepare(first, { keepOnDevice: true }), "InvalidOption", /run\(\)/);
    prepared.dispose();
    await rejects(() => prepared.run(first), "Conflict", /disposed/);
    return `${prepared.path}: 3 runs equal plain calls; ${worst}`;
  });

  add("device tensors: upload, keepOnDevice, chaining, read, write in place, dispose, foreign and disposed handles", async (engine) => {
    const held = engine.heldTensors;
    const host = { q: tensor(n, [1, 2, 64, 32]), k: tensor(n, [1, 2, 80, 32]), v: tensor(n, [1, 2, 80, 32]) };
    const q = await engine.upload(host.q), k = await engine.upload(host.k), v = await engine.upload(host.v);
    expect(q instanceof DeviceTensor && q.shape.join() === "1,2,64,32", "upload did not give a DeviceTensor");
    const mask = await engine.uploadMask({ data: new Uint8Array(64 * 80).fill(1).fill(0, 0, 10), shape: [64, 80] });
    const kept = await engine.attention({ q, k, v, mask }, { keepOnDevice: true, returnLse: true });
    expect(kept.y instanceof DeviceTensor && kept.lse instanceof DeviceTensor, "keepOnDevice did not keep");
    const onHost = await engine.attention({ ...host, mask: { data: new Uint8Array(64 * 80).fill(1).fill(0, 0, 10), shape: [64, 80] } }, { verify: true });
    const read = await kept.y.read();
    expect(maxDiff(read.data, onHost.y.data) === 0, "device call differs from the host call");
    expect(maxDiff((await q.read()).data, host.q.data) === 0, "read() of an upload differs");
    // An output as the next call's input, without a readback in between.
    const chained = await engine.attention({ q: kept.y, k, v }, { verify: true });
    expectVerified(chained, "chained");
    // New values written in place; another shape, or into a mask, refused.
    const next = tensor(n, [1, 2, 64, 32], 0.5);
    await q.write(next);
    expect(maxDiff((await q.read()).data, next.data) === 0, "write() then read() differs");
    await rejects(() => q.write(tensor(n, [1, 2, 32, 64])), "Rank");
    await rejects(() => mask.write(next), "InvalidOption", /mask/);
    for (const t of [q, k, v, mask, kept.y, kept.lse]) t.dispose();
    expect(engine.heldTensors === held, `${engine.heldTensors - held} tensors still held after dispose`);
    await rejects(() => engine.attention({ q, k: host.k, v: host.v }), "DisposedTensor", /disposed/);
    await rejects(() => q.read(), "DisposedTensor");
    const other = await WebAttn.create({ backend: "cpu" });
    const foreign = await other.upload(host.q);
    await rejects(() => engine.attention({ q: foreign, k: host.k, v: host.v }), "ForeignTensor", /another engine/);
    other.destroy();
    return `kept y equals the host call exactly; chained ${expectVerified(chained, "chained")}`;
  });

  add("a call reads its inputs when it is made: the caller may refill its arrays at once", async (engine) => {
    const q = tensor(n, [1, 2, 7, 16]), k = tensor(n, [1, 2, 9, 16]), v = tensor(n, [1, 2, 9, 16]);
    const x = tensor(n, [1, 5, 8]);
    const want = await engine.attention({ q, k, v });
    const wantUpload = new Float32Array(q.data);
    const wantRope = await engine.rope(x);
    // Each call is made, then its arrays are overwritten before it is awaited:
    // on an idle engine (the wasm core reads its arguments a microtask
    // later), then behind another call that holds the queue.
    const refill = (t) => ({ data: new Float32Array(t.data), shape: t.shape });
    const lines = [];
    for (const busy of [false, true]) {
      const ahead = busy ? engine.attention({ q, k, v }) : null;
      const mine = { q: refill(q), k: refill(k), v: refill(v) };
      const call = engine.attention(mine);
      const up = refill(q);
      const upload = engine.upload(up);
      const xr = refill(x);
      const roped = engine.rope(xr);
      for (const t of [mine.q, mine.k, mine.v, up, xr]) t.data.fill(Number.NaN);
      await ahead;
      const got = await call;
      expect(maxDiff(got.y.data, want.y.data) === 0, `${busy ? "a queued" : "an idle"} call read the refilled arrays`);
      const dev = await upload;
      expect(maxDiff((await dev.read()).data, wantUpload) === 0, `${busy ? "a queued" : "an idle"} upload read the refilled array`);
      dev.dispose();
      expect(maxDiff((await roped).output.data, wantRope.output.data) === 0, `${busy ? "a queued" : "an idle"} rope read the refilled array`);
      lines.push(busy ? "queued" : "idle");
    }
    // Options are read when the call is made too, and a tensor of another
    // make (a class instance whose data is not enumerable) is copied whole.
    const options = { isCausal: false };
    class Held {
      constructor(t) {
        Object.defineProperty(this, "data", { value: new Float32Array(t.data), enumerable: false });
        this.shape = t.shape;
      }
    }
    const held = new Held(q);
    const call = engine.attention({ q: held, k, v }, options);
    options.isCausal = true;
    held.data.fill(Number.NaN);
    expect(maxDiff((await call).y.data, want.y.data) === 0, "a call read its options or a class instance's data late");
    return `attention, upload and rope read their arrays when made (${lines.join(", ")})`;
  });

  add("bad input rejects with typed, named errors", async (engine) => {
    const q = tensor(n, [1, 2, 8, 16]), k = tensor(n, [1, 2, 9, 16]), v = tensor(n, [1, 2, 9, 16]);
    const msgs = [];
    msgs.push(await rejects(() => engine.attention({ q, k: tensor(n, [1, 2, 9, 12]), v }), "ShapeMismatch", /16/));
    msgs.push(await rejects(() => engine.attention({ q: { data: new Float32Array(5), shape: [1, 2, 8, 16] }, k, v }), "DataLength", /256/));
    msgs.push(await rejects(() => engine.attention({ q: { data: "abc", shape: [1] }, k, v }), "DType", /Float32Array/));
    msgs.push(await rejects(() => engine.attention({ q: tensor(n, [8, 16]), k, v }), "Rank"));
    msgs.push(await rejects(() => engine.attention({ q: tensor(n, [1, 3, 8, 16]), k, v }), "GqaHeads"));
    msgs.push(await rejects(() => engine.attention({ q, k, v }, { isCasual: true }), "InvalidOption", /`isCasual` is not an option \(did you mean `isCausal`\?\)/));
    msgs.push(await rejects(() => engine.attention({ q, k, v }, { return_lse: true }), "InvalidOption", /did you mean `returnLse`/));
    msgs.push(await rejects(() => engine.attention({ q, k, v, attnMask: null }), "InvalidOption", /attnMask/));
    msgs.push(await rejects(() => engine.attention({ q, v }), "MissingInput", /k/));
    msgs.push(await rejects(() => engine.attention({ q, k, v }, { qkMatmulOutputMode: 9 }), "InvalidOption", /option qkMatmulOutputMode = 9/));
    msgs.push(await rejects(() => engine.attention({ q, k, v }, { precision: "fastest" }), "InvalidOption", /highest/));
    msgs.push(await rejects(() => engine.attention({ q, k, v, mask: { data: new Uint8Array(7), shape: [7, 1] } }), "Broadcast"));
    msgs.push(await rejects(() => engine.attention(null), "InvalidOption"));
    msgs.push(await rejects(() => WebAttn.create({ limits: { notALimit: 5 } }), "InvalidOption", /not a limit/));
    msgs.push(await rejects(() => WebAttn.create({ backend: "tpu" }), "InvalidOption"));
    msgs.push(await rejects(() => WebAttn.create({ simd: "sse" }), "InvalidOption", /simd = "sse" is invalid/));
    // One past tensor without the other is an error, never silently dropped.
    msgs.push(await rejects(() => engine.attention({ q, k, v, pastKey: tensor(n, [1, 2, 3, 16]) }), "Conflict", /past_value/));
    // Sizes too large to allocate reject instead of aborting the wasm.
    msgs.push(await rejects(() => engine.warmup([{ q: [1, 1, 1 << 20, 1 << 12], k: [1, 1, 1, 16], v: [1, 1, 1, 16] }]), "Limit"));
    msgs.push(await rejects(() => engine.benchmark({ heads: 1 << 16, seqQ: 1 << 16, headDim: 64 }), "Limit"));
    msgs.push(await rejects(() => engine.benchmark({ causal: "yes" }), "InvalidOption"));
    msgs.push(await rejects(() => engine.benchmark({ heads: 4, kvHeads: 3 }), "InvalidOption", /kvHeads/));
    msgs.push(await rejects(() => engine.benchmark({ heads: 0, kvHeads: 1 }), "InvalidOption", /heads must be at least 1/));
    msgs.push(await rejects(() => engine.rope(tensor(n, [1, 4, 8]), { bass: 10 }), "InvalidOption", /bass/));
    msgs.push(await rejects(() => engine.luong({ score: 5 }), "InvalidOption"));
    // A dtype the engine does not know is refused, not ignored.
    msgs.push(await rejects(() => engine.attention({ q: { ...q, dtype: "fp16" }, k, v }), "DType", /fp16/));
    // Data whose buffer was transferred away (detached) is refused, not read
    // (reading it throws inside the call, which would never settle).
    const moved = new Float32Array(q.data);
    structuredClone(moved.buffer, { transfer: [moved.buffer] });
    msgs.push(await rejects(() => engine.attention({ q: { data: moved, shape: q.shape }, k, v }), "DType", /detached/));
    const movedMask = new Uint8Array(8 * 9);
    structuredClone(movedMask.buffer, { transfer: [movedMask.buffer] });
    msgs.push(await rejects(() => engine.attention({ q, k, v, mask: { data: movedMask, shape: [8, 9] } }), "DType", /detached/));
    const dev = await engine.upload(q);
    msgs.push(await rejects(() => engine.rope(dev), "DType", /read\(\)/));
    msgs.push(await rejects(() => engine.check(null), "InvalidOption", /kind/));
    dev.dispose();
    // The engine still works after every rejection.
    const r = await engine.attention({ q, k, v }, { verify: true });
    expectVerified(r, "after errors");
    return `${msgs.length} rejections, e.g. "${msgs[0]}"`;
  });

  add("the family: multi-head layer, KV-cache decoder, RoPE, sinusoidal, Bahdanau, Luong, linear", async (engine) => {
    const lines = [];
    const d = 32, heads = 4, kvHeads = 2, hd = 8;
    const w = (rows, cols) => ({ data: n(rows * cols, 1 / Math.sqrt(cols)), shape: [rows, cols] });
    const layer = engine.multiHeadAttention({
      weights: { wQ: w(heads * hd, d), bQ: { data: n(heads * hd, 0.1), shape: [heads * hd] }, wK: w(kvHeads * hd, d), wV: w(kvHeads * hd, d), wO: w(d, heads * hd) },
      heads, kvHeads, rope: { layout: "half-split" },
    });
    const x = tensor(n, [1, 9, d]);
    const full = await layer.forward(x, null, { isCausal: true, weights: true, verify: true });
    lines.push(`mha ${expectVerified(full, "mha")}`);
    expect(full.weights.shape.join() === "1,4,9,9", `mha weights shape ${full.weights.shape}`);
    const cross = await layer.forward(x, tensor(n, [1, 5, d]), { verify: true });
    lines.push(`cross ${expectVerified(cross, "cross")}`);
    // RoPE off and on by flag; a layer of a destroyed engine, a disposed layer.
    const plain = engine.multiHeadAttention({ weights: { wQ: w(heads * hd, d), wK: w(kvHeads * hd, d), wV: w(kvHeads * hd, d), wO: w(d, heads * hd) }, heads, kvHeads, rope: false });
    lines.push(`no rope ${expectVerified(await plain.forward(x, null, { verify: true }), "rope: false")}`);
    plain.dispose();
    await rejects(() => plain.forward(x), "Destroyed", /disposed/);
    await rejects(async () => layer.forward(x, null, { keepOnDevice: true }), "InvalidOption", /keepOnDevice/);
    const decoder = layer.decoder();
    await rejects(() => decoder.step(x, { verify: true }), "InvalidOption", /verify/);
    let last;
    for (const [from, to] of [[0, 4], [4, 5], [5, 9]]) {
      last = await decoder.step({ data: x.data.slice(from * d, to * d), shape: [1, to - from, d] });
    }
    expect(decoder.length === 9, `decoder length ${decoder.length}`);
    // Calls run in order: a reset asked for after a step runs after it.
    const running = decoder.step({ data: x.data.slice(0, d), shape: [1, 1, d] });
    await decoder.reset();
    expect((await running).output.shape.join() === `1,1,${d}` && decoder.length === 0, "reset did not follow the step");
    const cachedDiff = maxDiff(last.output.data, full.output.data.slice(5 * d));
    expect(cachedDiff < 1e-5, `decoder differs from the full pass by ${cachedDiff}`);
    lines.push(`decoder = full pass within ${cachedDiff.toExponential(1)}`);
    const xs = tensor(n, [2, 3, 257, 16]);
    lines.push(`rope ${expectVerified(await engine.rope(xs, { offset: 1000, verify: true }), "rope")}`);
    lines.push(`sinusoidal ${expectVerified(await engine.sinusoidal(xs, { verify: true }), "sinusoidal")}`);
    const s = tensor(n, [2, 7, 12]), h = tensor(n, [2, 97, 10]);
    const bahdanau = engine.bahdanau({ w1: w(16, 12), w2: w(16, 10), v: { data: n(16), shape: [16] } });
    lines.push(`bahdanau ${expectVerified(await bahdanau.forward(s, h, { lengths: [97, 40], weights: true, verify: true }), "bahdanau")}`);
    const hh = tensor(n, [2, 97, 12]);
    for (const [score, extra] of [["dot", {}], ["general", { w: w(12, 12) }], ["concat", { w: w(16, 24), v: { data: n(16), shape: [16] } }]]) {
      const luong = engine.luong({ score, ...extra });
      lines.push(`luong-${score} ${expectVerified(await luong.forward(s, hh, { weights: true, verify: true }), score)}`);
    }
    const lq = tensor(n, [1, 2, 97, 16]), lk = tensor(n, [1, 2, 97, 16]), lv = tensor(n, [1, 2, 97, 8]);
    lines.push(`linear ${expectVerified(await engine.linearAttention(lq, lk, lv, { causal: true, weights: true, verify: true }), "linear")}`);
    return lines.join("; ");
  });

  add("family checks on this adapter (check('family'))", async (engine) => {
    let calls = 0;
    const r = await engine.check("family", () => calls++);
    expect(r.failed === 0 && r.passed > 0, r.summary);
    expect(calls === r.passed + r.failed, `progress called ${calls} times`);
    return r.summary;
  });

  add("per-call overhead: warmup, then GPU time and end-to-end time of a repeated call", async (engine) => {
    const shape = [1, 4, 128, 64];
    const inputs = { q: tensor(n, shape), k: tensor(n, shape), v: tensor(n, shape) };
    // A fresh engine compiles its pipelines on first use; warmup() does it ahead.
    const fresh = await WebAttn.create({ backend: engine.backend });
    const t0 = performance.now();
    await fresh.attention(inputs);
    const cold = performance.now() - t0;
    const compiled = fresh.compiledPipelines;
    await fresh.attention(inputs);
    expect(fresh.compiledPipelines.length === compiled.length, "a repeated call compiled again");
    fresh.destroy();
    const other = await WebAttn.create({ backend: engine.backend });
    const warm = await other.warmup([{ q: shape, k: shape, v: shape }]);
    const t1 = performance.now();
    await other.attention(inputs);
    const afterWarmup = performance.now() - t1;
    other.destroy();
    const runs = [];
    for (let i = 0; i < 7; i++) {
      const t = performance.now();
      const r = await engine.attention(inputs, { timing: true });
      runs.push([performance.now() - t, r.timing.gpuMs]);
    }
    const median = (xs) => xs.sort((a, b) => a - b)[xs.length >> 1];
    const e2e = median(runs.map((r) => r[0])), gpu = runs[0][1] == null ? null : median(runs.map((r) => r[1]));
    const dev = { q: await engine.upload(inputs.q), k: await engine.upload(inputs.k), v: await engine.upload(inputs.v) };
    const resident = [];
    for (let i = 0; i < 7; i++) {
      const t = performance.now();
      const r = await engine.attention(dev, { keepOnDevice: true });
      r.y.dispose();
      resident.push(performance.now() - t);
    }
    Object.values(dev).forEach((t) => t.dispose());
    const f = (x) => (x == null ? "n/a" : `${x.toFixed(1)} ms`);
    return `B1 H4 N128 d64 on ${engine.backend}: first call on a fresh engine ${f(cold)} ` +
      `(compiling ${compiled.length} pipelines: ${compiled.join(", ")}); ` +
      `warmup on a fresh engine ${f(warm)}, then the first call ${f(afterWarmup)}; ` +
      `repeated call end to end ${f(e2e)} (GPU ${f(gpu)}); ` +
      `device-resident inputs with keepOnDevice: ${f(median(resident))} to enqueue (no readback)`;
  });

  add("benchmark and lastCall", async (engine) => {
    const r = await engine.benchmark({ heads: 2, seqQ: 64, headDim: 32 }, { timed: 3 });
    expect(r.medianMs > 0 && r.gflops > 0 && r.samplesMs.length === 3, JSON.stringify(r));
    expect(engine.lastCall && typeof engine.lastCall.path === "string", "no lastCall");
    // The plan in one line names the path it ran (`fused: attention_tiled[...]`, `cpu`).
    expect(engine.lastCall.plan.startsWith(engine.lastCall.path), `lastCall.plan: ${engine.lastCall.plan}`);
    // Grouped queries: 4 query heads over 2 KV heads, one query row (decode).
    const g = await engine.benchmark({ heads: 4, kvHeads: 2, seqQ: 1, seqK: 600, headDim: 32 }, { timed: 2 });
    expect(g.medianMs > 0 && g.samplesMs.length === 2, JSON.stringify(g));
    // Auto times the path a call of the shape takes: head dims the fused
    // kernel refuses (above 256) run unfused on a GPU, as attention() does.
    const wide = await engine.benchmark({ heads: 1, seqQ: 8, seqK: 8, headDim: 260 }, { timed: 1 });
    const widePath = engine.adapter.gpu ? "unfused" : "cpu";
    expect(wide.path === widePath, `head dim 260 timed on ${wide.path}, not ${widePath}`);
    return `${r.path} ${r.medianMs.toFixed(2)} ms, ${r.gflops.toFixed(2)} GFLOP/s; GQA decode ${g.medianMs.toFixed(2)} ms; d 260 on ${wide.path}`;
  });

  add("tune", async (engine) => {
    if (!engine.adapter.gpu) {
      await rejects(() => engine.tune(), "Conflict", /GPU/);
      return "cpu: refused (nothing to tune)";
    }
    // An engine of its own: the table it fills steers its later calls.
    const own = await WebAttn.create({ backend: "gpu" });
    const seen = [];
    const [r] = await own.tune({ headDims: [32] }, (label) => seen.push(label));
    expect(r.headDims.join() === "32,32", `head dims ${r.headDims}`);
    expect(r.timings.length >= 2 && r.timings.some((t) => t.label === "unfused"), JSON.stringify(r.timings));
    expect(seen.length >= 1 && r.fusedMs > 0 && r.unfusedMs > 0, `progress ${seen.length}, ${r.fusedMs} / ${r.unfusedMs}`);
    expect(typeof r.kernel === "string" && r.kernel.startsWith("attention_"), `kernel ${r.kernel}`);
    // The decode kernels too (wgpu gives the web no subgroups: the staged one).
    expect(r.decodeTimings.length >= 1 && typeof r.decodeKernel === "string" && r.decodeKernel.startsWith("attention_decode")
      && r.decodeMs > 0 && r.problem.decodeKeys > 0, `decode ${r.decodeKernel} ${JSON.stringify(r.decodeTimings)}`);
    // And on GQA groups of 4 query heads per KV head.
    expect(r.groupedDecodeTimings.length >= 1 && typeof r.groupedDecodeKernel === "string"
      && r.groupedDecodeKernel.startsWith("attention_decode") && r.groupedDecodeMs > 0,
      `grouped decode ${r.groupedDecodeKernel} ${JSON.stringify(r.groupedDecodeTimings)}`);
    await rejects(() => own.tune({ headDims: [0] }), "InvalidOption", /headDims/);
    await rejects(() => own.tune({ dims: [64] }), "InvalidOption", /headDims/);
    // Calls at the tuned head dims follow the table, and stay correct.
    const shape = [1, 2, 40, 32];
    const out = await own.attention({ q: tensor(n, shape), k: tensor(n, shape), v: tensor(n, shape) }, { verify: true });
    const line = `${r.kernel} ${r.fusedMs.toFixed(2)} ms, unfused ${r.unfusedMs.toFixed(2)} ms (${r.timings.length} timed), decode ${r.decodeKernel} ${r.decodeMs.toFixed(2)} ms, grouped ${r.groupedDecodeKernel}; ${expectVerified(out, "tuned")}`;
    own.destroy();
    return line;
  });

  add("tensors past one storage binding run in pieces", async (engine) => {
    if (!engine.adapter.gpu) return "skipped: no WebGPU adapter (the CPU backend has no bindings)";
    // 64 KiB bindings: one head's K (300 x 64 floats) is 75 KiB, so the keys are split too.
    const small = await WebAttn.create({ backend: "gpu", limits: { maxStorageBufferBindingSize: "64KiB" } });
    expect(small.adapter.limits.maxStorageBufferBindingSize === 64 << 10, "the limit was not applied");
    const shape = [2, 2, 300, 64];
    const inputs = { q: tensor(n, shape), k: tensor(n, shape), v: tensor(n, shape) };
    const options = { isCausal: true, leftWindowSize: 100 };
    await small.attention(inputs, options);
    const pieces = small.lastCall.pieces;
    expect(pieces > 1, `ran in ${pieces} piece(s)`);
    // verify repeats the call in the oracle (which then is the last call).
    const r = await small.attention(inputs, { ...options, verify: true });
    const line = `${pieces} pieces, ${expectVerified(r, "pieces")}`;
    small.destroy();
    return line;
  });

  add("tensors past one buffer are held in several", async (engine) => {
    if (!engine.adapter.gpu) return "skipped: no WebGPU adapter (the CPU backend has no buffers)";
    // 64 KiB buffers: Q, K, V and Y of 2 x 2 x 300 x 64 floats (150 KiB each) go to chunks.
    const small = await WebAttn.create({
      backend: "gpu",
      limits: { maxBufferSize: "64KiB", maxStorageBufferBindingSize: "64KiB" },
    });
    expect(small.adapter.limits.maxBufferSize === 64 << 10, "the limit was not applied");
    const shape = [2, 2, 300, 64];
    const inputs = { q: tensor(n, shape), k: tensor(n, shape), v: tensor(n, shape) };
    const options = { isCausal: true };
    await small.attention(inputs, options);
    const pieces = small.lastCall.pieces;
    expect(pieces > 1, `ran in ${pieces} piece(s)`);
    const r = await small.attention(inputs, { ...options, verify: true });
    const line = `${pieces} pieces, ${expectVerified(r, "chunks")}`;
    small.destroy();
    return line;
  });

  add("an engine left to choose takes the faster side", async () => {
    // The adapter when it is a GPU; the CPU backend when it is a CPU
    // implementation (SwiftShader in headless Chromium) or when there is none.
    const auto = await WebAttn.create();
    let adapter = null;
    try {
      const gpu = await WebAttn.create({ backend: "gpu" });
      adapter = gpu.adapter;
      gpu.destroy();
    } catch (e) {
      expect(e.name === "NoAdapter" || e.name === "RequestDevice", `${e.name}: ${e.message}`);
    }
    const software = !adapter || adapter.deviceType === "Cpu";
    expect(auto.backend === (software ? "cpu" : "gpu"), `auto took ${auto.backend} over ${adapter?.describe}`);
    if (adapter && software) {
      expect(/CPU implementation/.test(auto.adapter.reason ?? "") && /backend: "gpu"/.test(auto.adapter.reason),
        `reason: ${auto.adapter.reason}`);
    }
    const line = `${auto.backend}${auto.adapter.reason ? `: ${auto.adapter.reason}` : ""}`;
    auto.destroy();
    return line;
  });

  add("the CPU backend engine", async () => {
    const cpu = await WebAttn.create({ backend: "cpu" });
    expect(cpu.backend === "cpu" && !cpu.adapter.gpu, "not on the CPU");
    const r = await cpu.attention({ q: tensor(n, [1, 2, 97, 32]), k: tensor(n, [1, 2, 97, 32]), v: tensor(n, [1, 2, 97, 32]) }, { isCausal: true, verify: true });
    expect(r.path === "cpu", `path ${r.path}`);
    // Which wasm build runs: its instruction set is in the description.
    const describe = cpu.adapter.describe;
    if (isa) expect(describe.includes(`, ${isa};`) || describe.includes(`, ${isa})`), `not ${isa}: ${describe}`);
    const line = `cpu (${describe}) ${expectVerified(r, "cpu backend")}`;
    cpu.destroy();
    await rejects(() => cpu.attention({}), "Destroyed");
    return line;
  });

  if (worker) {
    add("no DOM in the worker", async () => {
      expect(typeof document === "undefined", "a document exists");
      return "ran without a document";
    });
  }
  return list;
}

/** Runs every case on a fresh engine; resolves to `[{name, ok, detail, ms}]`. */
export async function runSuite({ worker = false, backend = "auto", simd, isa } = {}) {
  const results = [];
  let engine;
  try {
    // The first engine of the realm loads the wasm: `simd` picks the build.
    engine = await WebAttn.create({ backend, simd });
  } catch (e) {
    return [{ name: "create", ok: false, detail: `${e.name}: ${e.message}`, ms: 0 }];
  }
  for (const { name, fn } of cases({ worker, isa })) {
    const t = performance.now();
    try {
      const detail = await fn(engine);
      results.push({ name, ok: true, detail: String(detail ?? ""), ms: performance.now() - t });
    } catch (e) {
      results.push({ name, ok: false, detail: `${e?.name}: ${e?.message ?? e}`, ms: performance.now() - t });
    }
  }
  engine.destroy();
  return results;
}
