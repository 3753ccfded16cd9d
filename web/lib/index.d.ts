// Type declarations for webattn, the ONNX Attention operator on WebGPU.
// Calls on one engine run one after another, in the order they were made.

/** A Float16Array, where the browser has one (declared structurally, since
 * older TypeScript libraries lack the type). */
/** What the backward pass takes of the forward call, beside its inputs. */
export interface BackwardForward {
  /** The forward's Y (3-D where the inputs were). */
  y: Tensor;
  /** The forward's row logsumexp [B, Hq, Nq]. */
  lse: Tensor;
  /** The loss's gradient with respect to Y, Y's shape. */
  dy: Tensor;
}

/** Packed sequences for `attentionRagged`. */
export interface RaggedInputs {
  /** Queries [total queries, Hq, Dk]. */
  q: Tensor;
  /** Keys [total keys, Hkv, Dk]. */
  k: Tensor;
  /** Values [total keys, Hkv, Dv]. */
  v: Tensor;
  /** Query offsets: batch + 1 whole numbers rising from 0 to Q's rows. */
  cuSeqlensQ: Int32Array | BigInt64Array | number[];
  /** Key offsets: batch + 1 whole numbers rising from 0 to K's rows. */
  cuSeqlensK: Int32Array | BigInt64Array | number[];
}

/** What `attentionRagged` resolves to. */
export interface RaggedResult {
  /** Y [total queries, Hq, Dv], packed as Q. */
  y: HostTensor;
  /** The row logsumexp [total queries, Hq] (with `returnLse`). */
  lse?: HostTensor;
}

/** What every page of a `PagedKvCache` holds. */
export interface PagedLayout {
  /** Key/value heads. */
  kvHeads: number;
  /** Values in a key row. */
  headDim: number;
  /** Values in a value row (default: headDim). */
  vHeadDim?: number;
  /** Tokens per page: 16, 32, 64, 128 or 256 (default 16). */
  pageSize?: number;
  /** The most pages the cache holds: an append past it is refused (OutOfMemory). */
  pageLimit?: number;
  /** How pages store values (default "f32"): "f16" halves the bytes, values rounded as appended; "int8" stores a byte a value and a scale per token and head (about half of f16's bytes, each value within half a step of the scale). */
  storage?: "f32" | "f16" | "int8";
}

/** What a `PagedKvCache` holds now. */
export interface PagedUsage {
  /** Pages the pool holds, in use or free. */
  pages: number;
  /** Pages some sequence holds. */
  pagesInUse: number;
  /** Bytes of the pool (keys and values). */
  bytes: number;
  /** Live sequences. */
  sequences: number;
  /** Whether the pages live in the GPU's memory. */
  onDevice: boolean;
  /** How the pages store values. */
  storage: "f32" | "f16" | "int8";
}

/** A paged KV cache for serving many sequences (`engine.pagedCache`). */
export declare class PagedKvCache {
  /** A new, empty sequence: its number. */
  addSequence(): Promise<number>;
  /** A sequence sharing every token of `seq` (pages shared until one writes into the last). */
  fork(seq: number): Promise<number>;
  /** Ends `seq`; its pages no other sequence holds are free at once. */
  free(seq: number): Promise<void>;
  /** Appends keys [kvHeads, n, headDim] and values [kvHeads, n, vHeadDim] to sequences, all or nothing. */
  append(items: { seq: number; k: Tensor; v: Tensor }[]): Promise<void>;
  /** Attention of each sequence's new queries [1, Hq, n, headDim] (its last n tokens) against its pages. */
  attention(queries: { seq: number; q: Tensor }[], options?: AttentionOptions): Promise<{ y: HostTensor; lse?: HostTensor }[]>;
  /** A sequence's keys and values [1, kvHeads, length, ·] through its block table. */
  read(seq: number): Promise<{ k: HostTensor; v: HostTensor }>;
  /** Tokens `seq` holds. */
  length(seq: number): number;
  /** `seq`'s pages in token order. */
  blockTable(seq: number): Uint32Array;
  /** What the cache holds now. */
  usage(): PagedUsage;
  /** Frees the pages now. */
  dispose(): void;
}

/** The gradients of one attention call's inputs. */
export interface BackwardResult {
  /** dQ, Q's shape. */
  dq: HostTensor;
  /** dK, K's shape (summed over each KV head's query heads). */
  dk: HostTensor;
  /** dV, V's shape. */
  dv: HostTensor;
  /** The past keys' gradient, where the call had a past. */
  dpastKey?: HostTensor;
  /** The past values' gradient. */
  dpastValue?: HostTensor;
  /** The path that ran ("fused", "cpu" or "oracle"). */
  path: string;
  /** The backward's plan, in words. */
  plan: string;
  /** With `verify`: the worst gradient against the f64 oracle's. */
  check?: { worstOutput: string; maxAbs: number; allowed: number; passed: boolean };
}

export interface Float16ArrayLike extends ArrayLike<number> {
  readonly BYTES_PER_ELEMENT: 2;
  readonly buffer: ArrayBufferLike;
  readonly byteOffset: number;
}

/** Element data a tensor accepts. Float16Array and Uint16Array (holding f16
 * bits) make an f16 tensor: stored as f16 on the device (half the bytes),
 * computed in f32, and the outputs it types (Y and the scores from Q, the
 * presents from K and V) come back f16 (as f32 data holding f16 values).
 * Float64Array and number[] are narrowed to f32. Other typed arrays are
 * rejected with a `DType` error. */
export type TensorData = Float32Array | Float16ArrayLike | Uint16Array | Float64Array | number[];

/** A tensor on the host: row-major data and its dimensions. */
export interface Tensor {
  data: TensorData;
  shape: readonly number[];
  /** `"float16"` stores any data as f16 (rounded to nearest); Uint16Array
   * data holds f16 bits unless `"bfloat16"` says it holds bfloat16 bits
   * (the upper half of each f32; widened exactly to an f32 tensor, since
   * the engine computes in f32: by `WebAttn.upload` on the device, from half
   * f32's bytes); `"bfloat16"` with other data is a `DType`
   * error. `"float32"` (what a returned `HostTensor` says) keeps f32 data as
   * it is; any other value is a `DType` error. */
  dtype?: "float16" | "float32" | "bfloat16";
}

/** A tensor returned by the engine. */
export interface HostTensor {
  data: Float32Array;
  shape: number[];
  /** `"float16"` when the values are f16 (widened into `data`). */
  dtype: "float32" | "float16";
}

/** An attention mask: booleans (Uint8Array or boolean[], true = attend) or an
 * additive float bias, broadcastable to `[batch, heads, queries, keys]`. */
export interface MaskTensor {
  data: Uint8Array | boolean[] | TensorData;
  shape: readonly number[];
  /** As `Tensor.dtype`, for Uint16Array (f16 or bfloat16) additive masks. */
  dtype?: "float16" | "bfloat16";
}

/** The inputs of `attention`, named as ONNX's in camelCase. */
export interface AttentionInputs {
  /** `[B, Hq, Nq, Dk]`, or `[B, Nq, Hq·Dk]` with `qNumHeads`. */
  q: Tensor | DeviceTensor;
  /** `[B, Hkv, Nk, Dk]`, or `[B, Nk, Hkv·Dk]` with `kvNumHeads`. */
  k: Tensor | DeviceTensor;
  /** `[B, Hkv, Nk, Dv]`, or `[B, Nk, Hkv·Dv]` with `kvNumHeads`. */
  v: Tensor | DeviceTensor;
  /** Added to (float) or selecting (bool) the scores. */
  mask?: MaskTensor | DeviceTensor;
  /** `[B, Hkv, P, Dk]`: the cache's keys, before `k`. */
  pastKey?: Tensor | DeviceTensor;
  /** `[B, Hkv, P, Dv]`. */
  pastValue?: Tensor | DeviceTensor;
  /** `[B]`: the valid keys of each batch entry (the rest is padding). */
  nonpadKvSeqlen?: BigInt64Array | Int32Array | number[];
}

/** The ONNX attributes in camelCase, and the library's own options. */
export interface AttentionOptions {
  /** Multiplies Q·Kᵀ (default 1/√Dk). */
  scale?: number;
  /** `softcap · tanh(x / softcap)` on the scores; 0 = off. */
  softcap?: number;
  /** Upper-left causal masking (offset by the past length). */
  isCausal?: boolean;
  /** Keys further than this to the left are masked; -1 = unbounded. */
  leftWindowSize?: number;
  /** Keys further than this to the right are masked; -1 = unbounded. */
  rightWindowSize?: number;
  /** Which scores to return as `qkMatmulOutput`: 0 the scaled Q·Kᵀ, 1 after softcap, 2 after softcap
   * and the whole bias (mask, causal, windows, padding, ALiBi; masked entries -inf), 3 the probabilities. */
  qkMatmulOutputMode?: 0 | 1 | 2 | 3;
  /** Accepted as ONNX allows; the kernels accumulate in f32. */
  softmaxPrecision?: number;
  /** Divides the scores before the softmax. */
  temperature?: number;
  /** In-kernel ALiBi biases (Press et al.). */
  alibi?: boolean;
  /** Return the rows' logsumexp `[B, Hq, Nq]` as `lse`. */
  returnLse?: boolean;
  /** Return `presentKey`/`presentValue` (past ++ new). */
  returnPresent?: boolean;
  /** `"auto"` (default), `"fused"`, `"unfused"`, `"cpu"` (fast f32) or `"oracle"` (f64). */
  path?: "auto" | "fused" | "unfused" | "cpu" | "oracle";
  /** `"highest"` (default: f32 products) or `"fast"` (f16 products on the matrix units natively, where
   * the adapter has them; browsers offer none, so in a page it runs the f32 kernels). */
  precision?: "highest" | "fast";
  /** Leave the outputs on the device as DeviceTensors (no readback). */
  keepOnDevice?: boolean;
  /** Query heads of 3-D inputs. */
  qNumHeads?: number;
  /** Key/value heads of 3-D inputs. */
  kvNumHeads?: number;
  /** Report `timing`: wall milliseconds and GPU milliseconds (timestamp queries, where the adapter has them). */
  timing?: boolean;
  /** Repeat the call in the f64 oracle and report the worst errors in `check`. */
  verify?: boolean;
}

/** How far an output is from the f64 oracle. */
export interface ErrorReport {
  /** Worst |got − exact|. */
  maxAbs: number;
  /** Twice the worst plain-f32 error of the same computation, plus a small floor. */
  allowed: number;
  passed: boolean;
}

/** What `attention` resolves to. Outputs are HostTensors, or DeviceTensors with `keepOnDevice`. */
export interface AttentionResult<T = HostTensor | DeviceTensor> {
  /** `[B, Hq, Nq, Dv]` (or `[B, Nq, Hq·Dv]` for 3-D inputs). */
  y: T;
  presentKey?: T;
  presentValue?: T;
  /** `[B, Hq, Nq, P + Nk]`. */
  qkMatmulOutput?: T;
  /** `[B, Hq, Nq]`. */
  lse?: T;
  /** The path taken. */
  path: "fused" | "unfused" | "cpu" | "oracle";
  /** The call's plan in one line: kernels with their tiles, pieces (as `lastCall.plan`). */
  plan?: string;
  /** Why the path differs from the default, when it does. */
  reason?: string;
  timing?: { wallMs: number; gpuMs: number | null };
  check?: { y: ErrorReport; qkMatmulOutput?: ErrorReport; lse?: ErrorReport; passed: boolean; oracleMs: number };
}

/** A tensor held on the engine's device. */
export declare class DeviceTensor {
  private constructor();
  readonly shape: readonly number[];
  readonly kind: "tensor" | "mask";
  readonly disposed: boolean;
  readonly engine: WebAttn;
  /** Reads the values back (a mask as its additive float form). */
  read(): Promise<HostTensor>;
  /** Writes new values of this tensor's shape and dtype into it, in place (no new device buffer): a decoder
   * feeds token after token through one tensor. A mask is uploaded again instead (`InvalidOption`). */
  write(values: HostTensor): Promise<void>;
  /** Frees the device memory now (also done when it is garbage-collected).
   * Where the runtime has `Symbol.dispose`, `[Symbol.dispose]()` does the same, for `using`. */
  dispose(): void;
}

/** Options of `WebAttn.create`. */
export interface CreateOptions {
  /** `"auto"` (GPU if the browser grants an adapter, else CPU), `"gpu"` or `"cpu"`. */
  backend?: "auto" | "gpu" | "cpu";
  powerPreference?: "high-performance" | "low-power" | "default";
  /** `"adapter"` (everything the adapter offers, the default), `"webgpu-default"`,
   * `"downlevel"`, or WebGPU limits to lower, e.g. `{ maxStorageBufferBindingSize: "4MiB" }`. */
  limits?: "adapter" | "webgpu-default" | "downlevel" | ({ preset?: string } & Record<string, number | string>);
  /** Threads of the CPU backend (one in the browser). */
  cpuThreads?: number;
  /** Which of the two wasm builds beside the module the CPU backend runs:
   * `"auto"` (the default: relaxed SIMD where the browser has it on an ARM
   * CPU, else SIMD128, which was as fast or faster on x86-64), `"relaxed"` (an
   * `InvalidOption` error where the browser lacks relaxed SIMD), `"simd128"`.
   * Only the first engine of a page or worker loads the module. */
  simd?: "auto" | "relaxed" | "simd128";
  /** A `.wasm` to load instead of the build `simd` picks (only the first
   * load in a page or worker counts). */
  wasm?: string | URL | Response | BufferSource | WebAssembly.Module;
}

/** The adapter an engine runs on. */
export interface AdapterInfo {
  gpu: boolean;
  /** One line: adapter, backend, and kernels. */
  describe: string;
  /** `"BrowserWebGpu"`, `"Vulkan"`, ... or `"cpu"`. */
  backend: string;
  /** The adapter's name: wgpu's, else the browser's description, else its vendor and architecture. */
  name?: string;
  /** What the browser reports (`GPUAdapter.info`), e.g. `"google"` and `"swiftshader"`. */
  vendor?: string;
  architecture?: string;
  deviceType?: string;
  /** Why the engine is not on the adapter: none, or a CPU implementation passed over. */
  reason?: string;
  paths: string[];
  limits?: {
    maxStorageBufferBindingSize: number; maxBufferSize: number; maxComputeWorkgroupStorageSize: number;
    maxComputeInvocationsPerWorkgroup: number; maxComputeWorkgroupsPerDimension: number;
  };
  features?: { shaderF16: boolean; subgroups: boolean; subgroupMinSize: number; subgroupMaxSize: number; timestampQuery: boolean };
  /** The plans of typical calls on this engine (a prefill, a decoder step, head dims past the fused kernels), as `webattn info` prints them. */
  plans?: { call: string; plan: string }[];
  /** The fused kernel calls run at head dims 64 (`attention_tiled` on GPUs, `attention_sg` on CPU adapters with fixed subgroups, `attention_fused` where neither fits). */
  fusedKernel?: string;
}

/** What a family member returns. */
export interface Attended {
  output: HostTensor;
  /** The attention weights, when asked for with `weights: true`. */
  weights?: HostTensor;
  check?: { output: ErrorReport; weights?: ErrorReport; passed: boolean };
}

/** Options of a multi-head layer's call: the attention options that apply to
 * its attention step, plus these. The others are an `InvalidOption` error. */
export interface FamilyOptions extends Omit<AttentionOptions,
  "keepOnDevice" | "timing" | "qNumHeads" | "kvNumHeads" | "returnLse" | "returnPresent" | "qkMatmulOutputMode"> {
  /** Return the attention weights. */
  weights?: boolean;
}

/** A layer made by the engine: usable while the engine lives. */
export interface Layer {
  /** Frees the layer (and its weights on the device); `[Symbol.dispose]()` too where the runtime has it. */
  dispose(): void;
}

/** A multi-head attention layer (weights `[out, in]`, uploaded once per engine). */
export interface MultiHeadAttention extends Layer {
  /** Self-attention (`keyValue` null) or cross-attention: `query` `[B, N, dModel]`, `keyValue` `[B, M, dKv]`. */
  forward(query: Tensor, keyValue?: Tensor | null, options?: FamilyOptions): Promise<Attended>;
  /** A causal decoder whose keys and values stay on the device. */
  decoder(): Decoder;
}

/** The KV-cache decoder of a multi-head layer. */
export interface Decoder extends Layer {
  /** Attends the next tokens `x` `[B, n, dModel]` to everything before them
   * (no `verify`: the oracle has no cache; verify `forward` on the whole sequence). */
  step(x: Tensor, options?: Omit<FamilyOptions, "verify">): Promise<Attended>;
  /** Tokens in the cache. */
  readonly length: number;
  /** Empties the cache, after the steps already asked for. */
  reset(): Promise<void>;
}

/** Bahdanau or Luong scoring. */
export interface ScoringLayer extends Layer {
  /** Decoder states `s` `[B, Nq, dS]` attending to encoder states `h` `[B, Nk, dH]`;
   * `lengths` `[B]` limits each batch entry's encoder states. */
  forward(s: Tensor, h: Tensor, options?: { lengths?: number[] | Int32Array; weights?: boolean; verify?: boolean }): Promise<Attended>;
}

/** A check's outcome. */
/** One training step's loss (mean cross-entropy, nats) and accuracy on its batch. */
export interface TrainPoint { step: number; loss: number; accuracy: number }

export interface CheckReport {
  /** One line per case with its worst error. */
  table: string;
  /** `"N passed, M failed"`. */
  summary: string;
  passed: number;
  failed: number;
  adapter?: string;
}

/** The attention engine. */
export declare class WebAttn {
  private constructor();
  /** Creates an engine on the browser's WebGPU adapter, or on the CPU backend where there is none or it is
   * a CPU implementation such as SwiftShader (`adapter.reason` says why; `backend: "gpu"` takes it anyway). */
  static create(options?: CreateOptions): Promise<WebAttn>;
  /** Every WGSL pipeline variant the engine may compile (code, entry point, override constants). */
  static kernelSources(options?: { wasm?: CreateOptions["wasm"]; simd?: CreateOptions["simd"] }): Promise<{ label: string; code: string; entry: string; constants: Record<string, number>; subgroups: boolean }[]>;
  readonly adapter: AdapterInfo;
  readonly backend: "gpu" | "cpu";
  /** The plan the last call ran (its path, and in one line its kernels, tiles and pieces, as the native
   * `Engine::last_call` and `webattn info` print it) and why, or null before the first. */
  readonly lastCall: {
    path: string;
    plan: string;
    reason?: string;
    allocatedBytes: number;
    /** Pieces the call ran in: 1, or more where its tensors exceed one storage binding. */
    pieces: number;
    /** Bytes of f32 scratch f16 inputs were widened into (0 where the kernel reads f16 in place). */
    widenedBytes: number;
  } | null;
  /** Device tensors not yet disposed. */
  readonly heldTensors: number;
  /** The labels of the pipelines compiled so far (each is compiled once per engine, on first use or in `warmup`). */
  readonly compiledPipelines: string[];
  /** The ONNX Attention operator. Rejects with an Error whose `name` is the error kind
   * (`ShapeMismatch`, `Rank`, `DType`, `InvalidOption`, `Limit`, `DeviceLost`, ...). */
  /**
   * The gradients of a forward call: `inputs` and `options` as the forward's;
   * `forward` its Y and logsumexp (`returnLse`) and the loss's gradient dY.
   */
  attentionBackward(inputs: AttentionInputs, forward: BackwardForward, options?: AttentionOptions): Promise<BackwardResult>;
  /**
   * Packed sequences without padding (FlashAttention's varlen form): each
   * sequence attends only its own keys. Y and the logsumexp come packed as Q.
   */
  attentionRagged(inputs: RaggedInputs, options?: AttentionOptions): Promise<RaggedResult>;
  attention(inputs: AttentionInputs, options?: AttentionOptions & { keepOnDevice?: false }): Promise<AttentionResult<HostTensor>>;
  attention(inputs: AttentionInputs, options: AttentionOptions & { keepOnDevice: true }): Promise<AttentionResult<DeviceTensor>>;
  attention(inputs: AttentionInputs, options?: AttentionOptions): Promise<AttentionResult>;
  /** Plans a call of these inputs' shapes and these options once; its runs reuse one workspace on the device. */
  prepare(inputs: AttentionInputs, options?: AttentionOptions): Promise<PreparedCall>;
  /** A paged KV cache on this engine, its pages where the engine computes. */
  pagedCache(layout: PagedLayout): PagedKvCache;
  /** Uploads a tensor to the device; pass the result as an input to skip the upload per call. */
  upload(tensor: Tensor): Promise<DeviceTensor>;
  /** Uploads a mask. */
  uploadMask(mask: MaskTensor): Promise<DeviceTensor>;
  /** Compiles ahead the pipelines these calls need (each entry the inputs' shapes, 3-D ones split by the
   * options' `qNumHeads`/`kvNumHeads`); resolves to milliseconds. Pipelines belong to this engine. */
  warmup(shapes: { q: number[]; k: number[]; v: number[]; mask?: number[]; pastKey?: number[]; pastValue?: number[] }[], options?: AttentionOptions): Promise<number>;
  /** Runs the conformance sweep (`"quick"`, `"full"`) or the family's checks on this adapter against the f64 oracle. */
  check(kind?: "quick" | "full" | "family", onProgress?: (done: number, total: number, name: string, passed: boolean) => void): Promise<CheckReport>;
  /**
   * Trains webattn's small attention model from scratch on associative recall (eight key/value pairs, then a
   * key: answer its value), the attention's forward and backward on this engine. `onProgress` after each step
   * (a promise it returns is awaited, so a page can draw).
   */
  trainRecall(options?: { steps?: number; batch?: number; seed?: number; learningRate?: number },
    onProgress?: (point: TrainPoint) => void | Promise<void>): Promise<{
    curve: TrainPoint[];
    /** The score on 256 held-out sequences after training. */
    heldOut: { loss: number; accuracy: number };
    /** The attention of held-out sequence 0, `[heads, 9, 9]`: row 8 is the question's. */
    map: { data: Float32Array; shape: number[] };
    /** That sequence: its pairs' keys and values, and which pair is asked. */
    example: { keys: number[]; values: number[]; asked: number };
  }>;
  /** Times attention of one shape on a path (median of `timed` runs after `warmup`); `path` `"auto"` (the
   * default) times the path `attention` would take for that shape, which the result names. */
  benchmark(shape: { batch?: number; heads?: number; kvHeads?: number; seqQ?: number; seqK?: number; headDim?: number; causal?: boolean },
    options?: { path?: AttentionOptions["path"]; warmup?: number; timed?: number }): Promise<{ path: string; medianMs: number; gflops: number; samplesMs: number[] }>;
  /**
   * Tunes this adapter (as `webattn tune` does natively): times every fused kernel and tile that fits, and
   * the unfused path, per head-dim class, and the decode kernels on one query row per head over many keys
   * (one KV head per query head, and GQA groups of 4), and keeps the fastest in the engine's tuning table (in memory), which later calls follow. Rejects with
   * `Conflict` on the CPU backend.
   */
  tune(options?: { headDims?: (number | [number, number])[] }, onProgress?: (label: string) => void): Promise<{
    headDims: [number, number];
    problem: { heads: number; seq: number; decodeHeads: number; decodeKeys: number };
    /** Every configuration timed, fastest first (`unfused` among them). */
    timings: { label: string; medianMs: number }[];
    /** Every decode kernel timed on the decode problem, fastest first (empty where decoding does not apply). */
    decodeTimings: { label: string; medianMs: number }[];
    /** Every decode kernel timed on the grouped decode problem (GQA groups of 4 query heads), fastest first. */
    groupedDecodeTimings: { label: string; medianMs: number }[];
    /** The fastest fused kernel, which calls at these head dims now use. */
    kernel: string;
    fusedMs: number;
    unfusedMs: number;
    /** The fastest decode kernel (null where decoding does not apply), which decode calls now use. */
    decodeKernel: string | null;
    decodeMs: number | null;
    /** The fastest decode kernel on the grouped problem, which decode calls with several rows per workgroup now use where it suits them. */
    groupedDecodeKernel: string | null;
    groupedDecodeMs: number | null;
  }[]>;
  /** A multi-head attention layer: weights `[out, in]`, biases optional, RoPE optional. */
  multiHeadAttention(config: {
    weights: { wQ: Tensor; bQ?: Tensor; wK: Tensor; bK?: Tensor; wV: Tensor; bV?: Tensor; wO: Tensor; bO?: Tensor };
    heads: number; kvHeads?: number; rope?: boolean | { base?: number; layout?: "interleaved" | "half-split"; offset?: number };
  }): MultiHeadAttention;
  /** Bahdanau's additive scoring `vᵀ tanh(W1 s + W2 h)`. */
  bahdanau(config: { w1: Tensor; w2: Tensor; v: Tensor }): ScoringLayer;
  /** Luong's scoring: `dot` (sᵀh), `general` (sᵀWh) or `concat` (vᵀ tanh(W[s; h])). */
  luong(config: { score?: "dot" | "general" | "concat"; w?: Tensor; v?: Tensor; scale?: number }): ScoringLayer;
  /** Linear attention with the elu+1 feature map on `[B, H, N, D]` tensors. */
  linearAttention(q: Tensor, k: Tensor, v: Tensor, options?: { causal?: boolean; weights?: boolean; verify?: boolean }): Promise<Attended>;
  /** Rotary position embeddings of `x` `[..., N, D]`. */
  rope(x: Tensor, options?: { base?: number; layout?: "interleaved" | "half-split"; offset?: number; verify?: boolean }): Promise<Attended>;
  /** `x + PE`, the sinusoidal encoding, for `x` `[..., N, D]`. */
  sinusoidal(x: Tensor, options?: { base?: number; offset?: number; verify?: boolean }): Promise<Attended>;
  /** Frees the engine and its device tensors. */
  destroy(): void;
}

export default WebAttn;

/** A call planned once (`WebAttn.prepare`): runs after the first allocate nothing on the device. Outputs kept
 * on the device live in its workspace until its next run. */
export declare class PreparedCall {
  /** The path its runs take. */
  readonly path: "fused" | "unfused" | "cpu" | "oracle";
  /** Its plan in one line: the kernels with their tiles and the pieces every run takes. */
  readonly plan: string;
  /** Why `auto` did not take the fused path, if it did not. */
  readonly reason?: string;
  /** Whether `dispose()` was called. */
  readonly disposed: boolean;
  /** Runs the call on inputs of the prepared shapes (options: only `keepOnDevice`, `timing`, `verify`). */
  run(inputs: AttentionInputs, options?: { keepOnDevice?: false; timing?: boolean; verify?: boolean }): Promise<AttentionResult<HostTensor>>;
  run(inputs: AttentionInputs, options: { keepOnDevice: true; timing?: boolean; verify?: boolean }): Promise<AttentionResult<DeviceTensor>>;
  /** Frees its workspace now. */
  dispose(): void;
}
