// webattn: the ONNX Attention operator (and its family) on WebGPU compute
// shaders, in the browser. The wasm core (./pkg) holds the engine; this module
// gives it a JavaScript shape: `WebAttn.create()`, typed arrays in and out,
// device tensors with read()/dispose(). Errors reject with an `Error` whose
// `name` is the engine's error kind. No DOM use: it runs in Web Workers too.
import init, { EngineCore, kernelSources } from "./pkg/webattn_web.js";

let loaded = null;

/** Loads and instantiates the wasm module once per realm (page or worker). */
function load(wasm) {
  loaded ??= init(wasm === undefined ? undefined : { module_or_path: wasm });
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

  /** Frees the device memory now (also done when the object is collected). */
  dispose() {
    if (this.#disposed) return;
    this.#disposed = true;
    collected?.unregister(this);
    this.#engine._core(true)?.dispose(this.#handle);
  }

  [Symbol.dispose ?? Symbol.for("Symbol.dispose")]() { this.dispose(); }

  /** @internal The handle, after checking it belongs to `engine` and is alive. */
  #ref(engine) {
    if (this.#disposed) throw libraryError("DisposedTensor", `device tensor [${this.#shape}] was disposed; upload the values again`);
    if (engine !== this.#engine) throw libraryError("ForeignTensor", `device tensor [${this.#shape}] belongs to another engine; read() it and pass the values, or upload it to this engine`);
    return this.#handle;
  }

  /** @internal */
  static _handle(t, engine) { return t.#ref(engine); }
}

const OUTPUTS = ["y", "presentKey", "presentValue", "qkMatmulOutput", "lse"];

/** The engine: one WebGPU device (or the CPU backend) and its compiled pipelines. */
export class WebAttn {
  #core;

  /** @internal Use `WebAttn.create()`. */
  constructor(core) { this.#core = core; }

  /**
   * Creates an engine on the browser's WebGPU adapter, or on the CPU backend
   * (f32, SIMD128) where there is none. Options: `backend` (`"auto"`, `"gpu"`,
   * `"cpu"`), `powerPreference`, `limits` (a preset or WebGPU limits),
   * `cpuThreads`, `wasm` (where the `.wasm` file is, if not beside this module).
   */
  static async create(options = {}) {
    const { wasm, ...rest } = options ?? {};
    await load(wasm);
    return new WebAttn(await EngineCore.create(rest));
  }

  /** Every WGSL pipeline variant the engine may compile, with its constants. */
  static async kernelSources(options = {}) {
    await load(options.wasm);
    return JSON.parse(kernelSources());
  }

  /** @internal */
  _core(quiet = false) {
    if (!this.#core) {
      if (quiet) return null;
      throw libraryError("Destroyed", "this engine was destroyed; create another with WebAttn.create()");
    }
    return this.#core;
  }

  /** The adapter (or CPU backend), its limits, features and kernels. */
  get adapter() { return this._core().adapter(); }
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
      out[key] = value instanceof DeviceTensor ? { handle: DeviceTensor._handle(value, this) } : value;
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
    return this.#wrap(await this._core().attention(this.#inputs(inputs), options));
  }

  /** Uploads `{ data, shape }` to the device. */
  async upload(tensor) {
    return new DeviceTensor(this, this.#core, await this._core().upload(tensor));
  }

  /** Uploads a mask `{ data, shape }` (Uint8Array/booleans: true attends; or additive floats). */
  async uploadMask(mask) {
    return new DeviceTensor(this, this.#core, await this._core().uploadMask(mask));
  }

  /** Compiles every pipeline the given calls need, ahead of them; resolves to the milliseconds taken. */
  async warmup(shapes, options = {}) { return this._core().warmup(shapes, options); }

  /** The conformance sweep (`"quick"`, `"full"`) or the family's checks (`"family"`) on this adapter. */
  async check(kind = "quick", onProgress = undefined) { return this._core().check(kind, onProgress); }

  /** Times one attention shape on a path: `{ path, medianMs, gflops, samplesMs }`. */
  async benchmark(shape, options = {}) { return this._core().benchmark(shape, options); }

  /** A multi-head attention layer whose weights are uploaded once. */
  multiHeadAttention(config) { return this._core().multiHeadAttention(config); }
  /** Bahdanau's additive scoring. */
  bahdanau(config) { return this._core().bahdanau(config); }
  /** Luong's dot, general or concat scoring. */
  luong(config) { return this._core().luong(config); }
  /** Linear attention (elu+1 feature map). */
  async linearAttention(q, k, v, options = {}) { return this._core().linearAttention(q, k, v, options); }
  /** Rotary position embeddings. */
  async rope(x, options = {}) { return this._core().rope(x, options); }
  /** The sinusoidal absolute position encoding added to `x`. */
  async sinusoidal(x, options = {}) { return this._core().sinusoidal(x, options); }

  /** Frees the engine and every device tensor it holds. */
  destroy() {
    const core = this.#core;
    this.#core = null;
    core?.free();
  }
}

export default WebAttn;
