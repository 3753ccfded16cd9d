"""Attention across processes: context parallelism on ``torch.distributed``.

A sequence too long for one device is split along its length, in rank
order, over the processes of a group: rank ``r`` holds its shard of the
queries, keys and values. :func:`ring_attention` passes the key/value shards
around the ring (each step one rank on, the next shard's transfer in flight
while the engine attends to the current one) and merges each rank's partial
results through their row logsumexps, which is exact: for two key sets A and
B, ``lse = logaddexp(lse_A, lse_B)`` and ``Y = Y_A·e^(lse_A−lse) +
Y_B·e^(lse_B−lse)``. Causal masking is by global positions. Every rank ends
with its own rows of Y; no rank ever holds more than two shards of K and V.

Runs on any backend torch.distributed offers for CPU tensors (gloo);
``python/examples/ring_attention.py`` runs it on 4 processes and checks it
against one process's full call.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

from ._engine import Engine
from ._sdpa import default_engine


def _merge(y, lse, y_part, lse_part):
    """Two partial results over disjoint key sets, merged through their logsumexps."""
    if y is None:
        return y_part, lse_part
    top = np.maximum(lse, lse_part)
    empty = np.isneginf(top)  # rows no key of either set may see
    top = np.where(empty, 0.0, top)
    w, w_part = np.exp(lse - top), np.exp(lse_part - top)
    total = w + w_part
    safe = np.where(empty, 1.0, total)
    merged = (y * w[..., None] + y_part * w_part[..., None]) / safe[..., None]
    return (np.where(empty[..., None], 0.0, merged).astype(np.float32),
            np.where(empty, -np.inf, top + np.log(safe)).astype(np.float32))


def _causal_mask(q_start: int, q_len: int, k_start: int, k_len: int) -> Optional[np.ndarray]:
    """The keys each query may see by global position: ``None`` for all of
    them, else a bool mask (an all-False one when none)."""
    if k_start + k_len - 1 <= q_start:
        return None
    i = q_start + np.arange(q_len)[:, None]
    j = k_start + np.arange(k_len)[None, :]
    return j <= i


def ring_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: Optional[float] = None,
    group: Any = None,
    engine: Optional[Engine] = None,
) -> torch.Tensor:
    """This rank's rows of attention over the whole sequence.

    ``query`` ``(B, Hq, n_r, D)``, ``key`` ``(B, Hkv, n_r, D)`` and
    ``value`` ``(B, Hkv, n_r, Dv)`` are this rank's shard of the sequence
    (shards in rank order; lengths may differ between ranks). Every rank of
    ``group`` must call it. Returns ``(B, Hq, n_r, Dv)`` float32.
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    engine = engine or default_engine()
    lengths = torch.zeros(world, dtype=torch.int64)
    lengths[rank] = query.shape[2]
    dist.all_reduce(lengths, group=group)
    starts = np.concatenate([[0], np.cumsum(lengths.numpy())])
    if key.shape[2] != query.shape[2]:
        raise ValueError(f"rank {rank}: the key shard has {key.shape[2]} tokens and the query "
                         f"shard {query.shape[2]}; each rank holds the same tokens of all three")
    q = query.detach().float().contiguous().numpy()
    kv = (key.detach().float().contiguous(), value.detach().float().contiguous())
    send_to, recv_from = (rank + 1) % world, (rank - 1) % world
    y = lse = None
    for step in range(world):
        source = (rank - step) % world
        incoming, pending = None, []
        if step + 1 < world:
            # The next shard (the one the previous rank holds now) travels
            # while this one is attended to.
            n_next = int(lengths[(rank - step - 1) % world])
            incoming = tuple(torch.empty(t.shape[:2] + (n_next,) + t.shape[3:]) for t in kv)
            for send, recv in zip(kv, incoming):
                pending.append(dist.isend(send, send_to, group=group))
                pending.append(dist.irecv(recv, recv_from, group=group))
        mask = None
        if is_causal:
            mask = _causal_mask(int(starts[rank]), q.shape[2], int(starts[source]), kv[0].shape[2])
        if mask is None or mask.any():
            out = engine.attention(q, kv[0].numpy(), kv[1].numpy(), mask, scale=scale,
                                   return_lse=True)
            y, lse = _merge(y, lse, out.y, out.lse)
        for request in pending:
            request.wait()
        if incoming is not None:
            kv = incoming
    if y is None:  # an empty shard
        y = np.zeros(q.shape[:3] + (value.shape[3],), np.float32)
    return torch.from_numpy(y)
