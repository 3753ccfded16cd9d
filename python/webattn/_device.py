"""What lives on the engine between calls: prepared calls and the KV cache."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from . import _webattn
from ._arrays import float_operand, output


def _outputs(out: dict, like_q: tuple, like_v: tuple):
    from ._engine import AttentionOutputs

    return AttentionOutputs(
        y=output(out["y"], *like_q),
        present_key=output(out.get("present_key"), *like_q),
        present_value=output(out.get("present_value"), *like_v),
        qk_matmul_output=output(out.get("qk_matmul_output"), *like_q),
        lse=output(out.get("lse"), "float32", like_q[1]),
    )


class PreparedAttention:
    """A call planned once (``Engine.prepare``): every :meth:`run` takes the
    same plan, with the shapes and options it was prepared for."""

    def __init__(self, native: Any) -> None:
        self._native = native

    @property
    def plan(self) -> str:
        """The plan: path, kernels, pieces, workspace, and why each was chosen."""
        return self._native.plan

    @property
    def workspace(self) -> tuple:
        """``(buffers, bytes)`` the call's workspace holds on the device."""
        return self._native.workspace

    def run(self, q: Any, k: Any, v: Any, attn_mask: Any = None, past_key: Any = None,
            past_value: Any = None, nonpad_kv_seqlen: Any = None):
        """The call on these inputs (of the prepared shapes); returns
        :class:`AttentionOutputs`. Shapes other than the prepared ones raise
        :class:`OptionError` (kind ``Conflict``)."""
        from ._engine import _read_call

        call = _read_call(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, None)
        out = self._native.run(call.arrays, f16=call.f16)
        return _outputs(out, (call.q.dtype, call.q.torch), (call.v.dtype, call.v.torch))

    def __repr__(self) -> str:
        return f"PreparedAttention({self.plan})"


class KvCache:
    """Keys and values of a batch of sequences on the engine, appended in
    place (O(new tokens) per append; the cache doubles when a sequence
    outgrows it). Attention reads it where it is, the cached lengths as
    ``nonpad_kv_seqlen``: a step's queries are the last tokens of each
    sequence, so causal positions continue from the lengths.

    >>> cache = webattn.KvCache(engine)
    >>> cache.append(k, v)                       # [B, Hkv, n, D]: n tokens to every sequence
    >>> y = cache.attention(q, is_causal=True).y  # [B, Hq, n, Dv]
    """

    def __init__(self, engine: Any, capacity: int = 256) -> None:
        self._native = _webattn.NativeKvCache(engine._native, capacity)

    @property
    def lengths(self) -> list:
        """Tokens cached per sequence."""
        return self._native.lengths

    @property
    def capacity(self) -> int:
        """Tokens each sequence can hold before the cache grows."""
        return self._native.capacity

    def append(self, key: Any, value: Any, counts: Optional[Sequence[int]] = None) -> None:
        """Appends ``key`` ``[B, Hkv, n, D]`` and ``value`` ``[B, Hkv, n, Dv]``:
        ``n`` tokens to every sequence, or with ``counts`` the last
        ``counts[b]`` rows to sequence ``b`` (the rows before are padding).
        float16 arrays stay f16 in the cache."""
        ko, vo = float_operand("key", key), float_operand("value", value)
        self._native.append(ko.array, vo.array, None if counts is None else list(counts),
                            f16=(ko.dtype == "float16", vo.dtype == "float16"))

    def attention(self, q: Any, **options: Any):
        """Attention of ``q`` ``[B, Hq, n, D]`` against everything cached, with
        :meth:`Engine.attention`'s options by name; returns
        :class:`AttentionOutputs` (Y in Q's dtype)."""
        qo = float_operand("Q", q)
        out = self._native.attention(qo.array, f16=qo.dtype == "float16", **options)
        return _outputs(out, (qo.dtype, qo.torch), ("float32", qo.torch))

    def present(self) -> tuple:
        """``(present_key, present_value)``: the cached keys and values as
        ONNX's external-cache outputs, float32 NumPy arrays."""
        return self._native.present()

    def __repr__(self) -> str:
        return f"KvCache(lengths={self.lengths}, capacity={self.capacity})"
