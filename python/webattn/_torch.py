"""PyTorch autograd for ``scaled_dot_product_attention``: a ``Function``
whose forward is the engine's call (with the row logsumexp kept) and whose
backward is the engine's ``attention_backward``. Imported only when torch
tensors are passed, so the package does not need torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._sdpa import Prepared


def wants_grad(*tensors: Any) -> bool:
    """Whether autograd must see this call."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
    )


def _unbroadcast(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """A gradient of a broadcast value summed back to the value's shape."""
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra else grad
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, engine, prepared: Prepared, query, key, value, attn_mask):
        out = engine._native.attention(
            prepared.arrays, f16=prepared.f16, return_lse=True, **prepared.options
        )
        ctx.engine, ctx.prepared = engine, prepared
        ctx.y, ctx.lse = out["y"], out["lse"]
        ctx.shapes = (query.shape, key.shape, value.shape)
        ctx.dtypes = (query.dtype, key.dtype, value.dtype)
        ctx.float_mask = attn_mask is not None and attn_mask.dtype != torch.bool
        ctx.mask_dtype = attn_mask.dtype if ctx.float_mask else None
        y = torch.from_numpy(out["y"].reshape(prepared.y_shape))
        return y.to(query.dtype)

    @staticmethod
    def backward(ctx, dy):
        prepared: Prepared = ctx.prepared
        dy4 = np.ascontiguousarray(dy.detach().cpu().float().numpy()).reshape(ctx.y.shape)
        mask_gradient = ctx.float_mask and ctx.needs_input_grad[5]
        g = ctx.engine._native.attention_backward(
            prepared.arrays,
            ctx.y,
            ctx.lse,
            dy4,
            f16=prepared.f16,
            mask_gradient=mask_gradient,
            **prepared.options,
        )
        grads = [
            torch.from_numpy(g[name]).reshape(shape).to(dtype)
            for name, shape, dtype in zip(("dq", "dk", "dv"), ctx.shapes, ctx.dtypes)
        ]
        d_mask = None
        if mask_gradient:
            # The native side saw the mask as 4-D (broadcast where the inputs
            # were not 4-D): fold its gradient back to the caller's shape.
            full = g["d_mask"]
            if full.shape != prepared.mask_shape:
                target = prepared.y_shape[:-1] + (prepared.arrays[1].shape[-2],)
                full = _unbroadcast(
                    np.broadcast_to(full, prepared.arrays[3].shape).reshape(target),
                    prepared.mask_shape,
                )
            d_mask = torch.from_numpy(np.array(full, dtype=np.float32)).to(ctx.mask_dtype)
        return (None, None, *grads, d_mask)


def attention_with_grad(engine, prepared: Prepared, query, key, value, attn_mask) -> Any:
    """The differentiable call."""
    return _Attention.apply(engine, prepared, query, key, value, attn_mask)
