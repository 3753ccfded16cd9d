// webattn: the ONNX Attention operator (and its family) on WebGPU compute
// shaders, in the browser. The wasm core (./pkg) holds the engine; this module
// gives it a JavaScript shape: `WebAttn.create()`, typed arrays in and out,
// device tensors with read()/dispose(). Errors reject with an `Error` whose
// `name` is the engine's error kind. No DOM use: it runs in Web Workers too.
import init, { EngineCore, kernelSources } from "./pkg/webattn_web.js";

let loaded = null;

// A module whose one function computes f32x4.relaxed_madd of three v128
// constants: a browser that validates it has relaxed SIMD.
const RELAXED_PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
  0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b, // type: () -> v128
  0x03, 0x02, 0x01, 0x00, // one function of that type
  0x0a, 0x3d, 0x01, 0x3b, 0x00, // code: one body of 59 bytes, no locals
  ...[0, 1, 2].flatMap(() => [0xfd, 0x0c, ...new Array(16).fill(0)]), // v128.const 0 (x3)
  0xfd, 0x85, 0x02, // f32x4.relaxed_madd
  0x0b, // end
]);

/** Whether this browser runs relaxed SIMD (checked once). */
let relaxedSimd = null;
function hasRelaxedSimd() {
  relaxedSimd ??= (() => {
    try {
      return WebAssembly.validate(RELAXED_PROBE);
    } catch {
      return false;
    }
  })();
  return relaxedSimd;
}

/** The CPU architecture the browser reports (Chromium's client hints:
 * "arm", "x86"), or "" where it tells none. */
async function architecture() {
  try {
    const hints = await globalThis.navigator?.userAgentData?.getHighEntropyValues?.(["architecture"]);
    return hints?.architecture ?? "";
  } catch {
    return "";
  }
}

/** Which wasm build to load for `simd` ("auto", "relaxed", "simd128"). Auto
 * takes relaxed SIMD where the browser has it on an ARM CPU, where
 * f32x4.relaxed_madd is one fused multiply-add (a model: not yet measured
 * there); on x86-64 the relaxed build ran the CPU backend no faster than
 * SIMD128 (1.02-1.26× its time on a Zen 4 in Chromium, 2026-11-29,
 * web/tests/wasm-builds.mjs), so auto keeps SIMD128 there. */
async function wasmFor(simd) {
  if (simd === "relaxed" && !hasRelaxedSimd()) {
    throw libraryError("InvalidOption", `option simd = "relaxed" is invalid: this browser has no relaxed SIMD (use "auto" or "simd128")`);
  }
  const relaxed = simd === "relaxed" || (simd === "auto" && hasRelaxedSimd() && (await architecture()) === "arm");
  // Two literal URLs, so that bundlers see (and ship) both files.
  return relaxed
    ? new URL("./pkg/webattn_web_relaxed_bg.wasm", import.meta.url)
    : new URL("./pkg/webattn_web_bg.wasm", import.meta.url);
}

/** Loads and instantiates the wasm module once per realm (page or worker):
 * `wasm` if given, else the build `simd` asks for; a failed load is tried
 * again on the next call. */
function load(wasm, simd = "auto") {
  if (!["auto", "relaxed", "simd128"].includes(simd)) {
    const hint = `one of "auto", "relaxed", "simd128"`;
    return Promise.reject(libraryError("InvalidOption", `option simd = ${JSON.stringify(simd)} is invalid: ${hint}`));
  }
  loaded ??= (async () => init({ module_or_path: wasm ?? (await wasmFor(simd)) }))().catch((e) => {
    loaded = null;
    throw e;
  });
  return loaded;
}

function libraryError(name, message) {
  const e = new Error(message);
  e.name = name;
  return e;
}

// Frees device buffers of tensors that were garbage-collected undisposed.
const collected = typeof FinalizationRegistry === "function"
  ? new FinalizationRegistry(({ core, handle }) => { try { core.dispose(handle); } catch { /* engine gone */ } })
  : null;

/** A tensor (or mask) held on the engine's device. */
export class DeviceTensor {
  #engine;
  #handle;
  #shape;
  #kind;
  #disposed = false;

  /** @internal Made by `WebAttn.upload`, `uploadMask` and `keepOnDevice` outputs. */
  constructor(engine, core, descriptor) {
    this.#engine = engine;
    this.#handle = descriptor.handle;
    this.#shape = Object.freeze([...descriptor.shape]);
    this.#kind = descriptor.kind;
    collected?.register(this, { core, handle: this.#handle }, this);
  }

  /** The dimensions. */
  get shape() { return this.#shape; }
  /** `"tensor"` or `"mask"`. */
  get kind() { return this.#kind; }
  /** Whether `dispose()` was called. */
  get disposed() { return this.#disposed; }
  /** The engine it lives on. */
  get engine() { return this.#engine; }

  /** Reads the values back: `{ data: Float32Array, shape }`. */
  async read() {
    return this.#engine._core().read(this.#ref(this.#engine));
  }

  /**
   * Writes new values `{ data, shape, dtype? }` of this tensor's shape and dtype into it, in place (no new
   * device buffer): a decoder feeds token after token through one tensor. Resolves once the write is queued.
   */
  async write(values) {
    const engine = this.#engine;
    const handle = this.#ref(engine);
    values = asNow(values);
    return engine._serial(() => engine._core().write(handle, values));
  }

  /** Frees the device memory now (also done when the object is collected). */
  dispose() {
    if (this.#disposed) return;
    this.#disposed = true;
    collected?.unregister(this);
    this.#engine._core(true)?.dispose(this.#handle);
  }

  /** @internal The handle, after checking it belongs to `engine` and is alive. */
  #ref(engine) {
    if (this.#disposed) throw libraryError("DisposedTensor", `device tensor [${this.#shape}] was disposed; upload the values again`);
    if (engine !== this.#engine) throw libraryError("ForeignTensor", `device tensor [${this.#shape}] belongs to another engine; read() it and pass the values, or upload it to this engine`);
    return this.#handle;
  }

  /** @internal */
  static _handle(t, engine) { return t.#ref(engine); }
}

// `using t = await engine.upload(...)` where the runtime has explicit resource management.
if (typeof Symbol.dispose === "symbol") {
  DeviceTensor.prototype[Symbol.dispose] = function dispose() { this.dispose(); };
}

/**
 * A call's host values as they are when the call is made. Calls run one after
 * another, so a call may wait for earlier ones, and even an idle engine's wasm
 * core reads its arguments a microtask later: a caller who refills its typed
 * array for the next batch right after the call (without awaiting it) would
 * otherwise have the call read the new values. Typed arrays and plain arrays
 * are copied (a view over a detached buffer is left as it is, for the core to
 * refuse); DeviceTensors, functions and other objects pass through.
 */
function asNow(value, depth = 0) {
  if (value === null || typeof value !== "object" || value instanceof DeviceTensor) return value;
  if (ArrayBuffer.isView(value)) {
    return value instanceof DataView || value.byteLength === 0 ? value : value.slice();
  }
  if (depth > 4) return value;
  if (Array.isArray(value)) return value.map((x) => asNow(x, depth + 1));
  const tensorLike = "data" in value;
  // Other objects (class instances, proxies) pass through, but a tensor of
  // any make is read now: its data, shape and dtype, own or inherited.
  if (Object.getPrototypeOf(value) !== Object.prototype && !tensorLike) return value;
  const out = {};
  for (const [key, x] of Object.entries(value)) out[key] = asNow(x, depth + 1);
  if (tensorLike) {
    for (const key of ["data", "shape", "dtype"]) {
      if (!(key in out) && value[key] !== undefined) out[key] = asNow(value[key], depth + 1);
    }
  }
  return out;
}

/** Family arguments are typed arrays: a DeviceTensor is an error that says so. */
function hostOnly(...values) {
  for (const v of values) {
    if (v instanceof DeviceTensor) {
      throw libraryError("DType", `the family's layers take typed arrays { data, shape }; read() the device tensor [${v.shape}] first`);
    }
  }
}

/** A layer of the family: the wasm object, used only while its engine lives. */
class Layer {
  #engine;
  #inner;
  constructor(engine, inner) {
    this.#engine = engine;
    this.#inner = inner;
  }
  /** @internal */
  _inner() {
    this.#engine._core();
    if (!this.#inner) throw libraryError("Destroyed", "this layer was disposed");
    return this.#inner;
  }
  /** @internal */
  _engine() { return this.#engine; }
  /** Frees the layer (and its weights on the device). */
  dispose() {
    const inner = this.#inner;
    this.#inner = null;
    try { inner?.free(); } catch { /* a call still runs: freed when it ends */ }
  }
}

/** A multi-head attention layer (weights uploaded once per engine). */
class MultiHeadAttention extends Layer {
  /** Self-attention (`keyValue` null) or cross-attention. */
  async forward(query, keyValue = null, options = {}) {
    hostOnly(query, keyValue);
    [query, keyValue, options] = [asNow(query), asNow(keyValue), asNow(options)];
    return this._engine()._serial(() => this._inner().forward(query, keyValue, options));
  }
  /** A causal decoder whose keys and values stay on the device. */
  decoder() { return new Decoder(this._engine(), this._inner().decoder()); }
}

/** The KV-cache decoder of a multi-head layer. */
class Decoder extends Layer {
  /** Attends the next tokens to everything before them. */
  async step(x, options = {}) {
    hostOnly(x);
    [x, options] = [asNow(x), asNow(options)];
    return this._engine()._serial(() => this._inner().step(x, options));
  }
  /** Tokens in the cache. */
  get length() { return this._inner().length; }
  /** Empties the cache, after the steps already asked for. */
  async reset() { return this._engine()._serial(() => this._inner().reset()); }
}

/** Bahdanau or Luong scoring. */
class ScoringLayer extends Layer {
  /** Decoder states `s` attending to encoder states `h`. */
  async forward(s, h, options = {}) {
    hostOnly(s, h);
    [s, h, options] = [asNow(s), asNow(h), asNow(options)];
    return this._engine()._serial(() => this._inner().forward(s, h, options));
  }
}

if (typeof Symbol.dispose === "symbol") {
  Layer.prototype[Symbol.dispose] = function dispose() { this.dispose(); };
}

const OUTPUTS = ["y", "presentKey", "presentValue", "qkMatmulOutput", "lse"];

// Frees prepared calls' workspaces that were garbage-collected undisposed.
const collectedCalls = typeof FinalizationRegistry === "function"
  ? new FinalizationRegistry(({ core, id }) => { try { core.disposePrepared(id); } catch { /* engine gone */ } })
  : null;

/**
 * A call planned once (`WebAttn.prepare`): its path is fixed and its runs
 * reuse one workspace on the device, so a run after the first allocates
 * nothing. Outputs kept on the device (`keepOnDevice`) live in that workspace
 * until the next run.
 */
export class PreparedCall {
  #engine;
  #id;
  #path;
  #plan;
  #reason;
  #disposed = false;

  /** @internal Made by `WebAttn.prepare`. */
  constructor(engine, core, descriptor) {
    this.#engine = engine;
    this.#id = descriptor.id;
    this.#path = descriptor.path;
    this.#plan = descriptor.plan;
    this.#reason = descriptor.reason;
    collectedCalls?.register(this, { core, id: this.#id }, this);
  }

  /** The path its runs take (`fused`, `unfused`, `cpu`, `oracle`). */
  get path() { return this.#path; }
  /** Its plan in one line: the kernels with their tiles and the pieces every run takes. */
  get plan() { return this.#plan; }
  /** Why `auto` did not take the fused path, if it did not. */
  get reason() { return this.#reason; }
  /** Whether `dispose()` was called. */
  get disposed() { return this.#disposed; }

  /**
   * Runs the call on inputs of the prepared shapes; `options` may hold only
   * `keepOnDevice`, `timing` and `verify`. Resolves as `attention` does.
   */
  async run(inputs, options = {}) {
    if (this.#disposed) throw libraryError("Conflict", "this prepared call was disposed; prepare it again");
    return this.#engine._runPrepared(this.#id, inputs, options);
  }

  /** Frees its workspace now (also done when the object is collected). */
  dispose() {
    if (this.#disposed) return;
    this.#disposed = true;
    collectedCalls?.unregister(this);
    this.#engine._core(true)?.disposePrepared(this.#id);
  }
}

/**
 * A paged KV cache (`engine.pagedCache(layout)`): one pool of pages of
 * `pageSize` tokens and a block table per sequence, as vLLM's PagedAttention
 * keeps them, its pages where the engine computes (WebGPU buffers, or wasm
 * memory on the CPU backend). Sequences are numbers the cache hands out.
 * Calls that change the cache wait for the engine's calls before them.
 */
export class PagedKvCache {
  #engine;
  #core;

  /** @internal Made by `WebAttn.pagedCache`. */
  constructor(engine, core) {
    this.#engine = engine;
    this.#core = core;
  }

  #live() {
    if (!this.#core) throw libraryError("Destroyed", "this paged cache was disposed");
    return this.#core;
  }

  /** A new, empty sequence: resolves to its number. */
  async addSequence() {
    return this.#engine._serial(() => this.#live().addSequence());
  }

  /** A sequence sharing every token of `seq` (a shared prompt, a beam): its pages are shared until one writes into the last. */
  async fork(seq) {
    return this.#engine._serial(() => this.#live().fork(seq));
  }

  /** Ends `seq`; its pages no other sequence holds are free at once. */
  async free(seq) {
    return this.#engine._serial(() => this.#live().freeSequence(seq));
  }

  /**
   * Appends `[{ seq, k, v }]`: keys `[kvHeads, n, headDim]`, values `[kvHeads,
   * n, vHeadDim]`, each sequence its own n. All or nothing: a refusal (a
   * freed sequence, a shape, the page limit) changes no sequence.
   */
  async append(items) {
    items = asNow(items);
    return this.#engine._serial(() => this.#live().append(items));
  }

  /**
   * Attention of each sequence's new queries `[{ seq, q }]` (Q `[1, Hq, n,
   * headDim]`: its last n tokens, their keys and values appended first)
   * against its pages, with `attention`'s options; resolves to `[{ y, lse? }]`
   * in the same order. On a GPU engine the kernel reads the pages in place,
   * every sequence in one submission.
   */
  async attention(queries, options = {}) {
    queries = asNow(queries);
    options = asNow(options);
    return this.#engine._serial(() => this.#live().attention(queries, options));
  }

  /** `seq`'s keys and values through its block table: `{ k, v }`, `[1, kvHeads, length, ·]`. */
  async read(seq) {
    return this.#engine._serial(() => this.#live().read(seq));
  }

  /** Tokens `seq` holds. */
  length(seq) { return this.#live().length(seq); }
  /** `seq`'s pages in token order (Uint32Array). */
  blockTable(seq) { return this.#live().blockTable(seq); }
  /** `{ pages, pagesInUse, bytes, sequences, onDevice, storage }`. */
  usage() { return this.#live().usage(); }

  /** Frees the pages now. */
  dispose() {
    const core = this.#core;
    this.#core = null;
    if (core) this.#engine._serial(() => core.free());
  }
}

/** What the browser says of its WebGPU adapter (`GPUAdapter.info`), or null. */
async function browserAdapterInfo(powerPreference) {
  try {
    const adapter = await globalThis.navigator?.gpu?.requestAdapter(powerPreference ? { powerPreference } : undefined);
    const info = adapter?.info ?? (await adapter?.requestAdapterInfo?.());
    return info ? { vendor: info.vendor, architecture: info.architecture, description: info.description } : null;
  } catch {
    return null;
  }
}

/** The engine: one WebGPU device (or the CPU backend) and its compiled pipelines. */
export class WebAttn {
  #core;
  #queue = Promise.resolve();
  #adapterInfo;

  /** @internal Use `WebAttn.create()`. */
  constructor(core, adapterInfo) {
    this.#core = core;
    this.#adapterInfo = adapterInfo;
  }

  /**
   * Creates an engine on the browser's WebGPU adapter, or on the CPU backend
   * (f32, SIMD128, or relaxed SIMD) where there is none or it is a CPU implementation
   * (SwiftShader: several times slower; `adapter.reason` says so, and
   * `backend: "gpu"` takes it anyway). Options: `backend` (`"auto"`, `"gpu"`,
   * `"cpu"`), `powerPreference`, `limits` (a preset or WebGPU limits),
   * `cpuThreads`, `simd` (which wasm build the first engine of a page or
   * worker loads: `"auto"`, `"relaxed"`, `"simd128"`), `wasm` (a `.wasm` to
   * load instead of the build beside this module).
   */
  static async create(options = {}) {
    const { wasm, simd, ...rest } = options ?? {};
    await load(wasm, simd);
    const core = await EngineCore.create(rest);
    return new WebAttn(core, core.backend() === "gpu" ? await browserAdapterInfo(rest.powerPreference) : null);
  }

  /** Every WGSL pipeline variant the engine may compile, with its constants. */
  static async kernelSources(options = {}) {
    await load(options.wasm, options.simd);
    return JSON.parse(kernelSources());
  }

  /** @internal Runs calls one after another, so each result's path and timing are its own. */
  _serial(fn) {
    const run = this.#queue.then(fn, fn);
    this.#queue = run.catch(() => {});
    return run;
  }

  /** @internal */
  _core(quiet = false) {
    if (!this.#core) {
      if (quiet) return null;
      throw libraryError("Destroyed", "this engine was destroyed; create another with WebAttn.create()");
    }
    return this.#core;
  }

  /** The adapter (or CPU backend), its limits, features and kernels; the
   * browser's own words for the adapter (vendor, architecture) where wgpu has none. */
  get adapter() {
    const a = this._core().adapter();
    const info = this.#adapterInfo;
    if (a.gpu && info) {
      a.vendor = info.vendor ?? "";
      a.architecture = info.architecture ?? "";
      if (!a.name) {
        a.name = info.description || [info.vendor, info.architecture].filter(Boolean).join(" ");
        if (a.describe.startsWith(" ")) a.describe = a.name + a.describe;
      }
    }
    return a;
  }
  /** `"gpu"` or `"cpu"`. */
  get backend() { return this._core().backend(); }
  /** The path the last call took (`fused`, `unfused`, `cpu`, `oracle`) and why. */
  get lastCall() { return this._core().lastCall(); }
  /** Device tensors not yet disposed. */
  get heldTensors() { return this._core().heldTensors(); }
  /** The labels of the pipelines compiled so far (each is compiled once per engine). */
  get compiledPipelines() { return this._core().compiledPipelines(); }

  #inputs(inputs) {
    if (inputs === null || typeof inputs !== "object") return inputs;
    const out = {};
    for (const [key, value] of Object.entries(inputs)) {
      out[key] = value instanceof DeviceTensor ? { handle: DeviceTensor._handle(value, this) } : asNow(value);
    }
    return out;
  }

  #wrap(result) {
    for (const key of OUTPUTS) {
      const v = result[key];
      if (v && v.handle !== undefined) result[key] = new DeviceTensor(this, this.#core, v);
    }
    return result;
  }

  /**
   * The ONNX Attention operator: `inputs` `{ q, k, v, mask?, pastKey?,
   * pastValue?, nonpadKvSeqlen? }` as `{ data, shape }` or DeviceTensors;
   * `options` the ONNX attributes in camelCase and `keepOnDevice`, `timing`,
   * `verify`, `path`. Resolves to `{ y, presentKey?, presentValue?,
   * qkMatmulOutput?, lse?, path, timing?, check? }`.
   */
  async attention(inputs, options = {}) {
    const args = this.#inputs(inputs);
    options = asNow(options);
    return this.#wrap(await this._serial(() => this._core().attention(args, options)));
  }

  /**
   * The gradients of a forward call (training): `inputs` and `options` as
   * the forward's, `forward` `{ y, lse, dy }` (its Y and logsumexp, asked
   * for with `returnLse`, and the loss's gradient dY), all as `{ data, shape }`.
   * Resolves to `{ dq, dk, dv, dpastKey?, dpastValue?, path, plan, check? }`.
   */
  async attentionBackward(inputs, forward, options = {}) {
    const args = this.#inputs(inputs);
    const given = this.#inputs(forward);
    options = asNow(options);
    return this._serial(() => this._core().attentionBackward(args, given, options));
  }

  /**
   * Packed sequences without padding (FlashAttention's varlen form):
   * `inputs` `{ q, k, v, cuSeqlensQ, cuSeqlensK }`, Q `[total queries, Hq,
   * Dk]`, K and V `[total keys, Hkv, ·]` as `{ data, shape }`, the offsets
   * (Int32Array, BigInt64Array or numbers) `batch + 1` of them from 0 to the
   * packed rows; each sequence attends only its own keys, with `options` as
   * `attention`'s. Resolves to `{ y, lse? }` packed as Q.
   */
  async attentionRagged(inputs, options = {}) {
    inputs = asNow(inputs);
    options = asNow(options);
    return this._serial(() => this._core().attentionRagged(inputs, options));
  }

  /**
   * A paged KV cache for serving many sequences: `layout` `{ kvHeads,
   * headDim, vHeadDim?, pageSize? (16 to 256, default 16), pageLimit?,
   * storage? ("f32" or "f16") }`.
   */
  pagedCache(layout) {
    return new PagedKvCache(this, this._core().pagedCache(asNow(layout)));
  }

  /**
   * Plans a call of the shapes of `inputs` (values or DeviceTensors) with
   * `options` (the ONNX attributes, `path`, `qNumHeads`/`kvNumHeads`) once;
   * resolves to a `PreparedCall` whose runs allocate nothing after the first.
   */
  async prepare(inputs, options = {}) {
    const core = this._core();
    const args = this.#inputs(inputs);
    options = asNow(options);
    return new PreparedCall(this, core, await this._serial(() => core.prepare(args, options)));
  }

  /** @internal A run of a prepared call. */
  async _runPrepared(id, inputs, options) {
    const args = this.#inputs(inputs);
    options = asNow(options);
    return this.#wrap(await this._serial(() => this._core().runPrepared(id, args, options)));
  }

  /** Uploads `{ data, shape }` to the device. */
  async upload(tensor) {
    const core = this._core();
    tensor = asNow(tensor);
    return new DeviceTensor(this, core, await this._serial(() => core.upload(tensor)));
  }

  /** Uploads a mask `{ data, shape }` (Uint8Array/booleans: true attends; or additive floats). */
  async uploadMask(mask) {
    const core = this._core();
    mask = asNow(mask);
    return new DeviceTensor(this, core, await this._serial(() => core.uploadMask(mask)));
  }

  /** Compiles every pipeline the given calls need, ahead of them; resolves to the milliseconds taken. */
  async warmup(shapes, options = {}) { return this._serial(() => this._core().warmup(shapes, options)); }

  /** The conformance sweep (`"quick"`, `"full"`) or the family's checks (`"family"`) on this adapter. */
  async check(kind = "quick", onProgress = undefined) {
    if (typeof kind !== "string") {
      throw libraryError("InvalidOption", `check(kind): kind must be "quick", "full" or "family", not ${String(kind)}`);
    }
    return this._serial(() => this._core().check(kind, onProgress));
  }

  /** Times one attention shape on a path: `{ path, medianMs, gflops, samplesMs }`. */
  async benchmark(shape, options = {}) { return this._serial(() => this._core().benchmark(shape, options)); }
  /**
   * Tunes this adapter: times every fused kernel and tile that fits, and the
   * unfused path, per head-dim class (`{ headDims: [[64, 64], 128] }`), and
   * keeps the fastest in the engine's tuning table (in memory), which later
   * calls follow. `onProgress(label)` before each configuration.
   */
  async tune(options = {}, onProgress = undefined) { return this._serial(() => this._core().tune(options, onProgress)); }

  /**
   * Trains webattn's small attention model from scratch on associative
   * recall (eight key/value pairs, then a key: answer its value), its
   * attention's forward and backward on this engine: `{ steps = 150, batch =
   * 64, seed = 7, learningRate = 0.01 }`; `onProgress({ step, loss, accuracy })`
   * after each step (a promise it returns is awaited). Resolves to `{ curve,
   * heldOut: { loss, accuracy }, map: { data, shape }, example }`.
   */
  async trainRecall(options = {}, onProgress = undefined) {
    return this._serial(() => this._core().trainRecall(options, onProgress));
  }

  /** A multi-head attention layer whose weights are uploaded once. */
  multiHeadAttention(config) { return new MultiHeadAttention(this, this._core().multiHeadAttention(config)); }
  /** Bahdanau's additive scoring. */
  bahdanau(config) { return new ScoringLayer(this, this._core().bahdanau(config)); }
  /** Luong's dot, general or concat scoring. */
  luong(config) { return new ScoringLayer(this, this._core().luong(config)); }
  /** Linear attention (elu+1 feature map). */
  async linearAttention(q, k, v, options = {}) {
    hostOnly(q, k, v);
    [q, k, v, options] = [asNow(q), asNow(k), asNow(v), asNow(options)];
    return this._serial(() => this._core().linearAttention(q, k, v, options));
  }
  /** Rotary position embeddings. */
  async rope(x, options = {}) {
    hostOnly(x);
    [x, options] = [asNow(x), asNow(options)];
    return this._serial(() => this._core().rope(x, options));
  }
  /** The sinusoidal absolute position encoding added to `x`. */
  async sinusoidal(x, options = {}) {
    hostOnly(x);
    [x, options] = [asNow(x), asNow(options)];
    return this._serial(() => this._core().sinusoidal(x, options));
  }

  /** Frees the engine and every device tensor it holds (layers made from it stop working). */
  destroy() {
    const core = this.#core;
    this.#core = null;
    try { core?.free(); } catch { /* a call still runs: freed when it ends */ }
  }
}

export default WebAttn;
