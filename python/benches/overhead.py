"""The Python call's overhead: ``Engine.attention`` and
``scaled_dot_product_attention`` from Python against the same call made from
Rust on the same engine and arrays (``NativeEngine.call_seconds``), on the
CPU backend at small sizes where the overhead shows. Prints a table and
writes JSON (``--json``, default target/bench/python-overhead.json).

    bash .ci/setup --python sh -c 'bash python/test.sh -q && target/python-venv/bin/python python/benches/overhead.py'
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

SHAPES = [(1, 1, 16, 16), (1, 8, 128, 64)]
ROUNDS = 9


def median_seconds(call, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", default="target/bench/python-overhead.json")
    args = parser.parse_args()
    engine = webattn.Engine("cpu")
    rng = np.random.default_rng(0)
    rows = []
    for b, h, n, d in SHAPES:
        q, k, v = (rng.standard_normal((b, h, n, d), dtype=np.float32) for _ in range(3))
        calls = args.calls if n * d <= 256 else max(args.calls // 20, 50)
        for _ in range(3):  # warm up both sides
            engine.attention(q, k, v)
            engine._native.call_seconds(q, k, v, 10)
        # Rounds that alternate the three, so that a busy moment of the
        # machine falls on all of them; the median of the rounds' medians.
        per_round = max(calls // ROUNDS, 10)
        rounds = {"rust": [], "python": [], "sdpa": []}
        for _ in range(ROUNDS):
            rounds["rust"].append(statistics.median(engine._native.call_seconds(q, k, v, per_round)))
            rounds["python"].append(median_seconds(lambda: engine.attention(q, k, v), per_round))
            rounds["sdpa"].append(median_seconds(
                lambda: webattn.scaled_dot_product_attention(q, k, v, engine=engine), per_round))
        rust, python, sdpa = (statistics.median(rounds[n]) for n in ("rust", "python", "sdpa"))
        rows.append(dict(shape=[b, h, n, d], calls=calls, rust_us=rust * 1e6,
                         python_us=python * 1e6, sdpa_us=sdpa * 1e6,
                         python_over_rust=python / rust, sdpa_over_rust=sdpa / rust))
    print(f"{engine.info()['description'].split(':')[0]}, Python {platform.python_version()}, "
          f"NumPy {np.__version__}; per call, the median of {ROUNDS} alternating rounds' medians")
    print(f"{'B H N d':<14}{'Rust µs':>10}{'Engine.attention µs':>22}{'×':>7}{'SDPA µs':>10}{'×':>7}")
    for r in rows:
        print(f"{' '.join(map(str, r['shape'])):<14}{r['rust_us']:>10.1f}{r['python_us']:>22.1f}"
              f"{r['python_over_rust']:>7.2f}{r['sdpa_us']:>10.1f}{r['sdpa_over_rust']:>7.2f}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(dict(engine=engine.info()["description"], python=platform.python_version(),
                       numpy=np.__version__, rows=rows), f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
