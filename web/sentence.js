// The teaching example as a heatmap: "Le chat était assis sur le tapis"
// (queries) attending to "The cat sat on the mat" (keys), scored by any
// member of the family, through the library's public API only.
//
// Embeddings are made from the tokens, so the picture is the same on every
// load: each word maps to a concept ("chat" and "cat" to `cat`, "était" and
// "assis" to `sit`), the concept to a unit vector drawn from a generator
// seeded by its name, plus a small sinusoidal position term (queries at the
// position their translation sits) that tells the two "the"s apart. Values
// are one-hot per key, so each row of Y is the row's attention weights.

export const KEYS = ["The", "cat", "sat", "on", "the", "mat"];
export const QUERIES = ["Le", "chat", "était", "assis", "sur", "le", "tapis"];
const DIM = 16;
const M64 = (1n << 64n) - 1n;

/** SplitMix64 (the engine's own generator): a function giving `n` standard normals. */
export function normals(seed) {
  let state = BigInt.asUintN(64, BigInt(seed));
  const next = () => {
    state = (state + 0x9e3779b97f4a7c15n) & M64;
    let z = state;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M64;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M64;
    return z ^ (z >> 31n);
  };
  const unit = () => Number(next() >> 11n) / 2 ** 53;
  return (n, scale = 1) => {
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      const u1 = Math.max(unit(), Number.MIN_VALUE), u2 = unit();
      out[i] = scale * Math.fround(Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2));
    }
    return out;
  };
}

function concept(word) {
  const w = word.toLowerCase();
  if (w === "the" || w === "le") return "the";
  if (w === "cat" || w === "chat") return "cat";
  if (["sat", "était", "assis"].includes(w)) return "sit";
  if (w === "on" || w === "sur") return "on";
  return "mat";
}

/** A unit vector drawn from a generator seeded by `name` (FNV-1a). */
function unitVector(name) {
  let seed = 0xcbf29ce484222325n;
  for (const b of new TextEncoder().encode(name)) seed = ((seed ^ BigInt(b)) * 0x100000001b3n) & M64;
  const v = normals(seed)(DIM);
  const norm = Math.hypot(...v);
  return v.map((x) => x / norm);
}

/** A sinusoidal position code of amplitude 0.35 at a fractional position. */
function position(pos) {
  return Array.from({ length: DIM }, (_, d) => {
    const angle = pos / 4 ** ((Math.floor(d / 2) * 2) / DIM);
    return 0.35 * (d % 2 === 0 ? Math.sin(angle) : Math.cos(angle));
  });
}

const embed = (word, pos, gain) => {
  const p = position(pos);
  return Array.from(unitVector(concept(word)), (c, d) => gain * (c + p[d]));
};

/** Queries `[7, DIM]` (scaled by `queryGain`) and keys `[6, DIM]`, flat. */
function embeddings(queryGain) {
  const stretch = (KEYS.length - 1) / (QUERIES.length - 1);
  return [
    QUERIES.flatMap((w, i) => embed(w, i * stretch, queryGain)),
    KEYS.flatMap((w, j) => embed(w, j, 1)),
  ];
}

const oneHot = () => Float32Array.from({ length: KEYS.length ** 2 }, (_, i) => (i % (KEYS.length + 1) === 0 ? 1 : 0));
const t = (data, shape) => ({ data: Float32Array.from(data), shape });
const diagonal = (n, gain, upTo = n) => Float32Array.from({ length: n * n }, (_, i) => (i % (n + 1) === 0 && Math.floor(i / n) < upTo ? gain : 0));

/** The rows with a constant feature 1 appended (`DIM + 1` wide): a bias for additive scores. */
const withConstant = (rows) => Array.from({ length: rows.length / DIM }, (_, r) => [...rows.slice(r * DIM, (r + 1) * DIM), 1]).flat();

/** Additive weights that make `vᵀ tanh(W1 s + W2 h)` a similarity: for each
 * feature a, `tanh(g(s_a − h_a) + c) − tanh(g(s_a − h_a) − c)`, a bump peaking
 * where the two agree. W1, W2 `[2·DIM, DIM + 1]`, v `[2·DIM]`. */
function bumpWeights(g, c, weight) {
  const width = DIM + 1;
  const w1 = new Float32Array(2 * DIM * width), w2 = new Float32Array(2 * DIM * width), v = new Float32Array(2 * DIM);
  for (let a = 0; a < DIM; a++) {
    for (const [block, sign] of [[0, 1], [1, -1]]) {
      const row = block * DIM + a;
      w1[row * width + a] = g;
      w1[row * width + DIM] = sign * c;
      w2[row * width + a] = -g;
      v[row] = sign * weight;
    }
  }
  return { w1, w2, v };
}

function states(queryGain) {
  const [q, k] = embeddings(queryGain);
  return [t(withConstant(q), [1, QUERIES.length, DIM + 1]), t(withConstant(k), [1, KEYS.length, DIM + 1])];
}

const CAPTIONS = {
  dot: "Scaled dot-product attention, softmax(QKᵀ/√d) V, on the engine's operator.",
  mha: "Multi-head cross-attention (2 heads; projections by the GEMM on a GPU engine): head 0's weights.",
  linear: "Linear attention with the elu+1 feature map: an O(N) kernel; the weights are drawn on request.",
  bahdanau: "Bahdanau (additive) attention, vᵀ tanh(W1 s + W2 h): W1 S and W2 H by the GEMM, the scores by their own kernel.",
  "luong-dot": "Luong dot scoring, sᵀh.",
  "luong-general": "Luong general scoring, sᵀWh (W = 10·I).",
  "luong-concat": "Luong concat scoring, vᵀ tanh(W [s; h]).",
};

/**
 * Runs the example scored by `variant` on `engine` (`path` picks fused or
 * unfused for the operator and the multi-head layer); the family's layers run
 * on `engine`. Resolves to `{heatmap, path, check, caption}`.
 */
export async function sentence(engine, path, variant) {
  const caption = CAPTIONS[variant] ?? CAPTIONS.dot;
  const done = (heatmap, r, taken) => ({ heatmap, path: taken, check: r.check.weights ?? r.check.qkMatmulOutput, caption });
  const onEngine = engine.backend === "gpu" ? "GPU" : "cpu";
  if (variant === "mha") {
    const layer = engine.multiHeadAttention({
      weights: { wQ: t(diagonal(DIM, 10), [DIM, DIM]), wK: t(diagonal(DIM, 1), [DIM, DIM]), wV: t(diagonal(DIM, 1), [DIM, DIM]), wO: t(diagonal(DIM, 1), [DIM, DIM]) },
      heads: 2,
    });
    const [q, k] = embeddings(1);
    const r = await layer.forward(t(q, [1, QUERIES.length, DIM]), t(k, [1, KEYS.length, DIM]), { path, weights: true, verify: true })
      .finally(() => layer.dispose());
    return done(r.weights.data.slice(0, QUERIES.length * KEYS.length), r, engine.lastCall?.path ?? path);
  }
  if (variant === "linear") {
    const [q, k] = embeddings(3);
    const r = await engine.linearAttention(t(q, [1, 1, QUERIES.length, DIM]), t(k.map((x) => 3 * x), [1, 1, KEYS.length, DIM]),
      t(oneHot(), [1, 1, KEYS.length, KEYS.length]), { weights: true, verify: true });
    return done(r.weights.data, r, onEngine);
  }
  if (variant === "bahdanau") {
    const { w1, w2, v } = bumpWeights(4, 1, 0.6);
    const layer = engine.bahdanau({ w1: t(w1, [2 * DIM, DIM + 1]), w2: t(w2, [2 * DIM, DIM + 1]), v: t(v, [2 * DIM]) });
    const [s, h] = states(1);
    const r = await layer.forward(s, h, { weights: true, verify: true }).finally(() => layer.dispose());
    return done(r.weights.data, r, onEngine);
  }
  if (variant.startsWith("luong-")) {
    const score = variant.slice("luong-".length);
    let config = { score }, gain = 1;
    if (score === "dot") gain = 10;
    if (score === "general") config = { score, w: t(diagonal(DIM + 1, 10, DIM), [DIM + 1, DIM + 1]) };
    if (score === "concat") {
      const { w1, w2, v } = bumpWeights(3, 1, 0.6);
      const width = DIM + 1;
      const w = [];
      for (let row = 0; row < 2 * DIM; row++) w.push(...w1.slice(row * width, (row + 1) * width), ...w2.slice(row * width, (row + 1) * width));
      config = { score, w: t(w, [2 * DIM, 2 * width]), v: t(v, [2 * DIM]) };
    }
    const [s, h] = states(gain);
    const layer = engine.luong(config);
    const r = await layer.forward(s, h, { weights: true, verify: true }).finally(() => layer.dispose());
    return done(r.weights.data, r, onEngine);
  }
  const [q, k] = embeddings(10);
  const r = await engine.attention(
    { q: t(q, [1, 1, QUERIES.length, DIM]), k: t(k, [1, 1, KEYS.length, DIM]), v: t(oneHot(), [1, 1, KEYS.length, KEYS.length]) },
    { qkMatmulOutputMode: 3, path, verify: true });
  return done(r.qkMatmulOutput.data, r, r.path);
}
