"""Serving many sequences: ragged calls on packed sequences and the paged
KV cache (``webattn::paged``)."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence as Seq

import numpy as np

from . import _webattn
from ._arrays import float_operand, lengths_operand, output


class RaggedOutputs(NamedTuple):
    """A ragged call's outputs, packed as its queries."""

    y: Any
    """``[total_q, Hq, Dv]`` in Q's dtype."""
    lse: Any = None
    """``[total_q, Hq]`` float32 (``return_lse=True``)."""


def attention_ragged(engine: Any, q: Any, k: Any, v: Any, cu_seqlens_q: Any,
                     cu_seqlens_k: Any, **options: Any) -> RaggedOutputs:
    """See :meth:`Engine.attention_ragged`."""
    qo, ko, vo = float_operand("Q", q), float_operand("K", k), float_operand("V", v)
    out = engine._native.attention_ragged(
        (qo.array, ko.array, vo.array),
        (lengths_operand(cu_seqlens_q), lengths_operand(cu_seqlens_k)),
        **options,
    )
    return RaggedOutputs(output(out["y"], qo.dtype, qo.torch),
                         output(out.get("lse"), "float32", qo.torch))


class PagedKvCache:
    """Keys and values of many sequences in one pool of fixed-size pages
    (vLLM's PagedAttention layout): each sequence reads its pages through its
    block table; sequences are added, appended to (several at once, each its
    own number of tokens), forked (pages shared, the last partial page copied
    on write: a shared prompt stored once) and freed (pages back at once).
    Every refusal (a freed sequence, a shape, the page limit) is a
    :class:`PagedError` or :class:`ShapeError` and changes nothing.

    >>> cache = webattn.PagedKvCache(engine, kv_heads=2, head_dim=64, page_size=16)
    >>> a = cache.add_sequence()
    >>> cache.append([(a, k, v)])                     # k [Hkv, n, D]
    >>> y = cache.attention([(a, q)], is_causal=True)[0].y   # q [1, Hq, n, D]
    """

    def __init__(self, engine: Any, kv_heads: int, head_dim: int,
                 v_head_dim: Optional[int] = None, page_size: int = 16,
                 page_limit: Optional[int] = None, storage: str = "f32") -> None:
        """Pages of ``page_size`` tokens (16-256) where ``engine`` computes
        (its GPU's memory, or the host); ``storage`` ``"f16"`` halves their
        bytes (values rounded to f16 as appended, read in place), ``"int8"``
        stores a byte a value and a scale per token and head (about half of
        f16's bytes; each value within half a step of ``max|row| / 127``)."""
        self._storage = storage
        self._native = _webattn.NativePagedKvCache(engine._native, kv_heads, head_dim,
                                                   v_head_dim or head_dim, page_size, page_limit,
                                                   storage)

    def add_sequence(self) -> Any:
        """A new, empty sequence (an opaque handle)."""
        return self._native.add_sequence()

    @property
    def sequences(self) -> list:
        """The live sequences."""
        return self._native.sequences()

    def length(self, seq: Any) -> int:
        """Tokens cached for ``seq``."""
        return self._native.length(seq)

    def block_table(self, seq: Any) -> list:
        """``seq``'s pages, in order."""
        return self._native.block_table(seq)

    @property
    def usage(self) -> dict:
        """``pages`` in the pool, ``pages_in_use``, ``bytes`` held and the
        pages' ``storage``."""
        pages, in_use, held = self._native.usage()
        return {"pages": pages, "pages_in_use": in_use, "bytes": held,
                "storage": self._storage}

    def fork(self, seq: Any) -> Any:
        """A new sequence sharing ``seq``'s tokens (pages shared until written)."""
        return self._native.fork(seq)

    def free(self, seq: Any) -> None:
        """Frees ``seq``; its pages return to the pool at once."""
        self._native.free(seq)

    def append(self, items: Seq[tuple]) -> None:
        """Appends ``(seq, key [Hkv, n, Dk], value [Hkv, n, Dv])`` for each
        item, all or nothing."""
        self._native.append([(s, float_operand("key", k).array, float_operand("value", v).array)
                             for s, k, v in items])

    def read(self, seq: Any) -> tuple:
        """``seq``'s keys ``[1, Hkv, len, Dk]`` and values, read through its pages."""
        return self._native.read(seq)

    def attention(self, queries: Seq[tuple], **options: Any) -> list:
        """Attention of each ``(seq, q [1, Hq, n, Dk])`` (its last ``n``
        tokens, appended first) against its pages, with
        :meth:`Engine.attention`'s options; one :class:`AttentionOutputs` per
        query."""
        from ._engine import AttentionOutputs

        read = [(s, float_operand("Q", q)) for s, q in queries]
        outs = self._native.attention([(s, op.array) for s, op in read], **options)
        return [AttentionOutputs(y=output(o["y"], op.dtype, op.torch),
                                 qk_matmul_output=output(o.get("qk_matmul_output"), op.dtype,
                                                         op.torch),
                                 lse=output(o.get("lse"), "float32", op.torch))
                for o, (_, op) in zip(outs, read)]

    def __repr__(self) -> str:
        return f"PagedKvCache({len(self.sequences)} sequences, {self.usage})"
