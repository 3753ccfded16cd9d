#!/usr/bin/env python3
"""onnxruntime's CPU `Attention` (ONNX opset 23) on the shapes `webattn bench` uses.

A peer figure for BENCHMARKS.md, not part of the test suite or CI:

    pip install onnxruntime onnx numpy
    python3 examples/onnxruntime_cpu_attention.py                       # B=1 H=8 N=2048 d=64, causal and not
    python3 examples/onnxruntime_cpu_attention.py --seq 1024 --batch 4 --threads 1

The model is one `Attention` node with 4D inputs Q, K, V [B, H, N, d] (f32),
`is_causal` as asked, default scale 1/sqrt(d). Inputs are unit normals from a
fixed seed. Each configuration is run `--warmup` times untimed, then `--runs`
times; the median wall-clock time of `session.run` is reported with GFLOP/s
counted as webattn counts them (4·B·H·N²·d, halved for causal).
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper


def attention_model(causal: bool) -> bytes:
    shape = ["B", "H", "N", "D"]
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], is_causal=int(causal))
    graph = helper.make_graph(
        [node],
        "attention",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "QKV"],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model.SerializeToString()


def measure(args, causal: bool) -> dict:
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        attention_model(causal), options, providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(1)
    shape = (args.batch, args.heads, args.seq, args.head_dim)
    feeds = {n: rng.standard_normal(shape, dtype=np.float32) for n in "QKV"}
    for _ in range(args.warmup):
        session.run(None, feeds)
    samples = []
    for _ in range(args.runs):
        start = time.perf_counter()
        session.run(None, feeds)
        samples.append((time.perf_counter() - start) * 1e3)
    ms = statistics.median(samples)
    flops = 4.0 * args.batch * args.heads * args.seq * args.seq * args.head_dim
    if causal:
        flops /= 2
    return {
        "batch": args.batch,
        "heads": args.heads,
        "seq": args.seq,
        "head_dim": args.head_dim,
        "causal": causal,
        "threads": args.threads,
        "ms": ms,
        "samples_ms": samples,
        "gflops": flops / (ms * 1e6),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="intra-op threads (0: onnxruntime's default)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    args = p.parse_args()
    modes = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    if not args.json:
        print(f"onnxruntime {ort.__version__} CPU Attention (opset 23), f32")
        print(f"{'batch':>5} {'heads':>5} {'seq':>6} {'d':>4} {'causal':>6} {'threads':>7} {'ms':>9} {'GFLOP/s':>8}")
    for causal in modes:
        r = measure(args, causal)
        if args.json:
            print(json.dumps(r))
        else:
            print(
                f"{r['batch']:>5} {r['heads']:>5} {r['seq']:>6} {r['head_dim']:>4} "
                f"{'yes' if causal else 'no':>6} {r['threads']:>7} {r['ms']:>9.1f} {r['gflops']:>8.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
