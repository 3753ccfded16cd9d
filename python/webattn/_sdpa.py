"""PyTorch's ``scaled_dot_product_attention`` signature and meanings on the
engine.

Where PyTorch and ONNX differ, PyTorch's meaning holds here:

- ``is_causal`` is upper-left aligned (query ``i`` sees keys ``j <= i``), as
  ONNX's is without a past; with a cache, call :meth:`Engine.attention`,
  whose causal mask continues from the past.
- A bool ``attn_mask`` is True where a key takes part (as ONNX's); it must
  broadcast to ``(..., L, S)`` by NumPy's rules (ONNX would also pad a short
  last dimension; PyTorch refuses it and so do we).
- ``attn_mask`` together with ``is_causal=True`` is refused, as PyTorch does.
- A fully masked row gives zeros (PyTorch's ``_safe_softmax`` since 2.5;
  ONNX's rule too).
- Query and key head counts must match unless ``enable_gqa=True``; then
  query head ``h`` reads key head ``h // (Hq // Hkv)``.
- ``dropout_p`` must be 0: the engine has no dropout.

With PyTorch tensors that require gradients the call is differentiable
(``webattn._torch``): its backward is the engine's.
"""

from __future__ import annotations

import math
import threading
from typing import Any, NamedTuple, Optional

import numpy as np

from ._arrays import Operand, float_operand, mask_operand, output
from ._engine import Engine
from ._errors import OptionError, ShapeError

_default_engine: Optional[Engine] = None
_default_lock = threading.Lock()


def default_engine() -> Engine:
    """The engine ``scaled_dot_product_attention`` uses when given none:
    ``Engine("auto")``, made at the first call and shared."""
    global _default_engine
    with _default_lock:
        if _default_engine is None:
            _default_engine = Engine("auto")
        return _default_engine


def _four_d(name: str, shape: tuple) -> tuple:
    """``(..., H, L, E)`` as ``(batch, H, L, E)``; 2-D and 3-D inputs have one head."""
    if len(shape) < 2:
        raise ShapeError(
            f"{name} has shape {list(shape)}; expected (..., L, E) with at least 2 dimensions",
            "Rank",
        )
    if len(shape) == 2:
        return (1, 1) + shape
    if len(shape) == 3:
        return (shape[0], 1) + shape[1:]
    return (math.prod(shape[:-3]),) + shape[-3:]


class Prepared(NamedTuple):
    """An SDPA call read and checked: the operands (their dtypes and kinds),
    the 4-D arrays the native side takes, the options, and the shapes to
    give back."""

    q: Operand
    k: Operand
    v: Operand
    arrays: tuple
    f16: Optional[dict]
    options: dict
    y_shape: tuple
    mask_shape: Optional[tuple]


def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    engine: Optional[Engine] = None,
) -> Any:
    """``torch.nn.functional.scaled_dot_product_attention`` on the engine.

    ``query`` ``(N, ..., Hq, L, E)``, ``key`` ``(N, ..., H, S, E)``, ``value``
    ``(N, ..., H, S, Ev)`` as NumPy arrays or PyTorch CPU tensors; returns
    ``(N, ..., Hq, L, Ev)`` in the query's kind and dtype. ``engine`` defaults
    to :func:`default_engine`. With PyTorch tensors that require gradients
    (and grad mode on) the call is an autograd ``Function`` whose backward
    is the engine's (``attention_backward``; a float mask that requires
    gradients gets its own). See the module's text for where PyTorch's
    meanings differ from ONNX's.
    """
    prepared = prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    engine = engine or default_engine()
    if prepared.q.torch:
        from . import _torch

        if _torch.wants_grad(query, key, value, attn_mask):
            return _torch.attention_with_grad(engine, prepared, query, key, value, attn_mask)
    out = engine._native.attention(prepared.arrays, f16=prepared.f16, **prepared.options)
    return output(out["y"].reshape(prepared.y_shape), prepared.q.dtype, prepared.q.torch)


def prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> Prepared:
    """Checks an SDPA call as PyTorch would and reads its arrays as 4-D."""
    if dropout_p != 0.0:
        raise OptionError(
            f"option dropout_p = {dropout_p} is invalid: the engine has no dropout; pass 0.0 "
            "(as PyTorch does in evaluation) or apply dropout outside attention",
            "InvalidOption",
        )
    if is_causal and attn_mask is not None:
        raise OptionError(
            "attn_mask and is_causal=True cannot be combined (as in PyTorch): fold the causal "
            "mask into attn_mask",
            "Conflict",
        )
    q, k, v = (float_operand(n, x) for n, x in (("query", query), ("key", key), ("value", value)))
    qs, ks, vs = q.array.shape, k.array.shape, v.array.shape
    if not (len(qs) == len(ks) == len(vs)):
        raise ShapeError(
            f"query, key and value must have the same rank; got {list(qs)}, {list(ks)}, {list(vs)}",
            "Rank",
        )
    # (..., H, L, E) from 4-D on; below that every leading dimension is batch.
    batch = slice(None, -3) if len(qs) >= 4 else slice(None, -2)
    if qs[batch] != ks[batch] or ks[:-1] != vs[:-1] or qs[-1:] != ks[-1:]:
        raise ShapeError(
            f"query {list(qs)}, key {list(ks)} and value {list(vs)} do not fit: the batch "
            "dimensions must match, key and value share (..., H, S) and query and key share E",
            "ShapeMismatch",
        )
    if len(qs) >= 4 and qs[-3] != ks[-3] and not enable_gqa:
        raise ShapeError(
            f"query has {qs[-3]} heads and key {ks[-3]}: different head counts need "
            "enable_gqa=True (as in PyTorch)",
            "GqaHeads",
        )
    lead = qs[:-1]
    if len(qs) == 4:
        q4, k4, v4 = q.array, k.array, v.array
    else:
        q4 = q.array.reshape(_four_d("query", qs))
        k4 = k.array.reshape(_four_d("key", ks))
        v4 = v.array.reshape(_four_d("value", vs))
    mask4 = None
    if attn_mask is not None:
        m = mask_operand(attn_mask).array
        target = qs[:-1] + (ks[-2],)
        try:
            full_shape = np.broadcast_shapes(m.shape, target)
        except ValueError:
            full_shape = None
        if full_shape != target:
            raise ShapeError(
                f"attn_mask has shape {list(m.shape)}, which does not broadcast to "
                f"(..., L, S) = {list(target)}",
                "Broadcast",
            )
        if len(qs) != 4:
            m = np.ascontiguousarray(np.broadcast_to(m, target)).reshape(q4.shape[:-1] + (k4.shape[-2],))
        mask4 = m
    f16 = None
    if "float16" in (q.dtype, k.dtype, v.dtype):
        f16 = {"q": q.dtype == "float16", "k": k.dtype == "float16", "v": v.dtype == "float16",
               "past_key": False, "past_value": False}
    options = {}
    if scale is not None:
        options["scale"] = scale
    if is_causal:
        options["is_causal"] = True
    mask_shape = None if attn_mask is None else tuple(attn_mask.shape)
    return Prepared(q, k, v, (q4, k4, v4, mask4, None, None, None), f16, options,
                    lead + (vs[-1],), mask_shape)
