"""``webattn.MultiHeadAttention``: a multi-head attention layer (projections,
optional RoPE, attention, output projection) on the engine, over whole
sequences or one decoder step at a time through a :class:`KvCache`."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from . import _webattn
from ._device import KvCache


class MultiHeadAttention:
    """A layer of ``heads`` query heads and ``kv_heads`` key/value heads
    (GQA where fewer), from ``weights``: float32 arrays ``w_q`` ``[heads·D,
    d_model]``, ``w_k`` and ``w_v`` ``[kv_heads·D, d_kv]``, ``w_o``
    ``[d_model, heads·Dv]``, and optional biases ``b_q``, ``b_k``, ``b_v``,
    ``b_o``. ``rope_base`` applies rotary embeddings to the projected queries
    and keys (``rope_layout`` ``"interleaved"`` or ``"half"``);
    ``f16_weights`` keeps the weights in f16 on the device."""

    def __init__(
        self,
        engine: Any,
        weights: Mapping[str, Any],
        heads: int,
        kv_heads: Optional[int] = None,
        *,
        rope_base: Optional[float] = None,
        rope_layout: str = "interleaved",
        f16_weights: bool = False,
    ) -> None:
        arrays = {n: np.asarray(w, dtype=np.float32) for n, w in weights.items() if w is not None}
        self._native = _webattn.NativeMha(engine._native, arrays, heads, kv_heads or heads,
                                          rope_base, rope_layout, f16_weights)

    @classmethod
    def random(cls, engine: Any, d_model: int, heads: int, head_dim: int, *,
               kv_heads: Optional[int] = None, d_kv: Optional[int] = None, seed: int = 0,
               **options: Any) -> "MultiHeadAttention":
        """A layer with random weights (uniform in ±1/√fan_in, as ``Linear``
        initialises them, with biases)."""
        kv_heads = kv_heads or heads
        weights = _webattn.random_mha_weights(d_model, heads, head_dim, kv_heads,
                                              d_kv or d_model, seed)
        return cls(engine, weights, heads, kv_heads, **options)

    @property
    def dims(self) -> dict:
        """``d_model``, ``d_kv``, ``heads``, ``kv_heads``, ``head_dim``, ``v_head_dim``."""
        names = ("d_model", "d_kv", "heads", "kv_heads", "head_dim", "v_head_dim")
        return dict(zip(names, self._native.dims))

    def __call__(self, query: Any, key_value: Any = None, *, need_weights: bool = False,
                 **options: Any) -> tuple:
        """Self- (``key_value`` ``None``) or cross-attention over whole
        sequences: ``query`` ``[B, N, d_model]``, ``key_value`` ``[B, M,
        d_kv]``; options as :meth:`Engine.attention`'s (``is_causal``,
        windows, ``softcap``, ...). Returns ``(output [B, N, d_model],
        weights [B, heads, N, M] or None)``."""
        return self._native.forward(np.asarray(query, dtype=np.float32),
                                    None if key_value is None
                                    else np.asarray(key_value, dtype=np.float32),
                                    need_weights=need_weights, **options)

    def step(self, x: Any, cache: KvCache, *, need_weights: bool = False, **options: Any) -> tuple:
        """One decoder step of causal self-attention: ``x`` ``[B, n,
        d_model]`` holds the next ``n`` tokens; their keys and values go into
        ``cache``. Returns ``(output [B, n, d_model], weights or None)``."""
        return self._native.step(np.asarray(x, dtype=np.float32), cache._native,
                                 need_weights=need_weights, **options)

    def serve(self, cache: Any, steps: Any, **options: Any) -> list:
        """One serving step over a :class:`PagedKvCache`: ``steps`` is
        ``[(seq, x), ...]``, each sequence's next tokens ``x`` ``[1, n,
        d_model]`` (a prompt or one token); their keys and values go into
        the sequence's pages and every sequence attends to its own, causal
        positions (and RoPE's) continuing from its length, in one paged call.
        Returns each sequence's output ``[1, n, d_model]``, in order."""
        return self._native.serve(cache._native,
                                  [(seq, np.asarray(x, dtype=np.float32)) for seq, x in steps],
                                  **options)

    def __repr__(self) -> str:
        return f"MultiHeadAttention({self.dims})"
