"""Ragged against padded: one batch of sequences of different lengths,
causal self-attention, as packed sequences (``Engine.attention_ragged``)
and as the padded batch a server without ragged calls would run (every
sequence padded to the longest, the real lengths as ``nonpad_kv_seqlen``),
at the same real tokens, on the CPU backend and on the adapter in one run.
Prints a table and writes JSON (``--json``, default
target/bench/ragged.json).

    bash .ci/setup --python sh -c 'bash python/test.sh -q && target/python-venv/bin/python python/benches/ragged.py'
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

import webattn

# Real tokens are a quarter of the padded ones: 8 sequences padded to 512.
LENGTHS = [512, 32, 64, 96, 128, 64, 48, 80]
HEADS, KV_HEADS, DIM = 8, 2, 64


def median_ms(call, repeats: int) -> float:
    call()  # warm: pipelines compiled, workspace made
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default="target/bench/ragged.json")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    batch, longest, real = len(LENGTHS), max(LENGTHS), sum(LENGTHS)
    cu = np.cumsum([0] + LENGTHS).astype(np.int32)
    q = rng.standard_normal((real, HEADS, DIM), dtype=np.float32)
    k = rng.standard_normal((real, KV_HEADS, DIM), dtype=np.float32)
    v = rng.standard_normal((real, KV_HEADS, DIM), dtype=np.float32)
    # The padded batch: keys and values first in each row of the batch, the
    # queries last (ONNX's nonpad_kv_seqlen places a call's queries at the
    # end of each sequence), zeros elsewhere.
    pad = lambda h: np.zeros((batch, h, longest, DIM), np.float32)
    pq, pk, pv = pad(HEADS), pad(KV_HEADS), pad(KV_HEADS)
    for i, n in enumerate(LENGTHS):
        pq[i, :, longest - n:] = q[cu[i]:cu[i + 1]].transpose(1, 0, 2)
        pk[i, :, :n] = k[cu[i]:cu[i + 1]].transpose(1, 0, 2)
        pv[i, :, :n] = v[cu[i]:cu[i + 1]].transpose(1, 0, 2)
    lengths = np.array(LENGTHS, np.int64)
    rows = []
    for backend in ("cpu", "gpu"):
        engine = webattn.Engine(backend)
        # The padded call's last n rows of sequence i are the ragged call's
        # rows (checked below); its other query rows are the extra work a
        # padded server does.
        padded = lambda: engine.attention(pq, pk, pv, is_causal=True,
                                          nonpad_kv_seqlen=lengths)
        ragged = lambda: engine.attention_ragged(q, k, v, cu, cu, is_causal=True)
        y_padded, y_ragged = padded().y, ragged().y
        differs = max(float(np.abs(y_padded[i, :, longest - n:].transpose(1, 0, 2)
                                   - y_ragged[cu[i]:cu[i + 1]]).max())
                      for i, n in enumerate(LENGTHS))
        t_padded, t_ragged = median_ms(padded, args.repeats), median_ms(ragged, args.repeats)
        rows.append(dict(backend=backend, device=engine.info()["description"].split(";")[0],
                         padded_ms=t_padded, ragged_ms=t_ragged, ratio=t_ragged / t_padded,
                         max_difference=differs))
    print(f"{batch} sequences, {real} real tokens of {batch * longest} padded "
          f"({real / (batch * longest):.0%}), H {HEADS}/{KV_HEADS}, d {DIM}, causal; "
          f"median of {args.repeats}")
    print(f"{'backend':<8}{'padded ms':>12}{'ragged ms':>12}{'ragged/padded':>16}"
          f"{'max |difference|':>19}")
    for r in rows:
        print(f"{r['backend']:<8}{r['padded_ms']:>12.2f}{r['ragged_ms']:>12.2f}{r['ratio']:>15.0%}"
              f"{r['max_difference']:>19.2g}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(dict(lengths=LENGTHS, heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM,
                       python=platform.python_version(), rows=rows), f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
