"""Attention across processes: one causal attention call over a sequence
split between ``--world`` processes (torch.distributed, gloo, on this
machine), each holding a shard of the queries, keys and values, the shards
passed around the ring (webattn.distributed.ring_attention). Rank 0 gathers
the rows and checks them against one process's full call, and both against
the engine's f64 oracle by the tolerance rule; the exit status says whether
they agree.

    python python/examples/ring_attention.py --world 4 --tokens 1000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import webattn
from webattn.distributed import ring_attention


def inputs(args):
    """The whole sequence, the same on every rank (one seed)."""
    rng = np.random.default_rng(args.seed)
    shape = lambda h, d: (1, h, args.tokens, d)
    return (rng.standard_normal(shape(args.heads, args.dim)).astype(np.float32),
            rng.standard_normal(shape(args.kv_heads, args.dim)).astype(np.float32),
            rng.standard_normal(shape(args.kv_heads, args.dim)).astype(np.float32))


def shards(tokens: int, world: int) -> list[slice]:
    """Shards in rank order, as even as the tokens allow (lengths differ by one)."""
    bounds = np.linspace(0, tokens, world + 1).round().astype(int)
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def worker(rank: int, args, init: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.world)
    engine = webattn.Engine(args.backend)
    q, k, v = inputs(args)
    mine = shards(args.tokens, args.world)[rank]
    local = [torch.from_numpy(np.ascontiguousarray(x[:, :, mine])) for x in (q, k, v)]
    dist.barrier()
    start = time.perf_counter()
    y = ring_attention(*local, is_causal=args.causal, engine=engine)
    seconds = time.perf_counter() - start
    rows = [None] * args.world
    dist.all_gather_object(rows, (rank, y.numpy(), seconds))
    if rank == 0:
        check(args, engine, q, k, v, rows)
    dist.destroy_process_group()


def check(args, engine, q, k, v, rows) -> None:
    ring = np.concatenate([r[1] for r in sorted(rows, key=lambda r: r[0])], axis=2)
    start = time.perf_counter()
    full = engine.attention(q, k, v, is_causal=args.causal).y
    full_seconds = time.perf_counter() - start
    exact = engine.attention(q, k, v, is_causal=args.causal, path="oracle").y.astype(np.float64)
    # The tolerance rule: twice a plain f32 computation's error, plus a floor.
    plain = engine.attention(q, k, v, is_causal=args.causal, path="cpu").y
    allowed = 2 * np.abs(plain - exact) + 1e-6 * max(1.0, np.abs(exact).max())
    share = lambda got: float(np.max(np.abs(got - exact) / allowed))
    ring_share, full_share = share(ring), share(full)
    print(f"{args.world} processes, {args.tokens} tokens (shards of "
          f"{', '.join(str(s.stop - s.start) for s in shards(args.tokens, args.world))}), "
          f"H {args.heads}/{args.kv_heads}, d {args.dim}, {'causal' if args.causal else 'not causal'}, "
          f"on {engine.info()['backend']}")
    print(f"  ring vs one process's call: worst |difference| {np.abs(ring - full).max():.3g}")
    print(f"  against the f64 oracle: ring {ring_share:.2f}, one call {full_share:.2f} "
          f"of the error allowed")
    print(f"  time: ring {max(r[2] for r in rows) * 1e3:.1f} ms (slowest rank), "
          f"one call {full_seconds * 1e3:.1f} ms")
    if ring_share > 1.0:
        print("FAILED: the ring is outside the tolerance rule", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--backend", default="cpu", help="auto, gpu or cpu (each process its own engine)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        mp.spawn(worker, args=(args, init), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
