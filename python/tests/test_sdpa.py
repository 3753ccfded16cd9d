"""webattn.scaled_dot_product_attention with PyTorch's meanings, against a
NumPy reference of PyTorch's documented computation (its
``scaled_dot_product_attention`` reference code, with ``_safe_softmax``'s
zero rows). The same grid against torch itself: test_torch.py."""

from __future__ import annotations

import numpy as np
import pytest

import webattn
from reference import assert_close


def torch_reference(query, key, value, attn_mask=None, is_causal=False, scale=None,
                    enable_gqa=False, dtype=np.float64):
    """PyTorch's reference computation in NumPy (``dtype`` arithmetic)."""
    q, k, v = (np.asarray(x, dtype) for x in (query, key, value))
    L, S = q.shape[-2], k.shape[-2]
    scale_factor = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    bias = np.zeros((L, S), dtype)
    if is_causal:
        bias = np.where(np.tril(np.ones((L, S), bool)), 0.0, -np.inf).astype(dtype)
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        bias = bias + (np.where(m, 0.0, -np.inf) if m.dtype == np.bool_ else m.astype(dtype))
    if enable_gqa:
        k = np.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
        v = np.repeat(v, q.shape[-3] // v.shape[-3], axis=-3)
    w = q @ np.swapaxes(k, -2, -1) * dtype(scale_factor) + bias
    with np.errstate(invalid="ignore"):
        e = np.exp(w - w.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    p = np.where(np.all(np.isneginf(w), -1, keepdims=True), 0.0, p)  # _safe_softmax
    return p @ v


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


GRID = {
    "3-D (N, L, E)": dict(q=(2, 7, 16), k=(2, 9, 16), v=(2, 9, 8)),
    "4-D": dict(q=(2, 3, 7, 16), k=(2, 3, 9, 16), v=(2, 3, 9, 16)),
    "5-D": dict(q=(2, 2, 3, 5, 16), k=(2, 2, 3, 6, 16), v=(2, 2, 3, 6, 8)),
    "causal, L < S (top-left)": dict(q=(1, 2, 5, 16), k=(1, 2, 12, 16), v=(1, 2, 12, 16), is_causal=True),
    "causal, L > S": dict(q=(1, 2, 12, 16), k=(1, 2, 5, 16), v=(1, 2, 5, 16), is_causal=True),
    "scale": dict(q=(1, 2, 7, 16), k=(1, 2, 7, 16), v=(1, 2, 7, 16), scale=0.05),
    "gqa": dict(q=(1, 8, 7, 16), k=(1, 2, 11, 16), v=(1, 2, 11, 16), enable_gqa=True),
    "bool mask (L, S)": dict(q=(2, 2, 7, 16), k=(2, 2, 9, 16), v=(2, 2, 9, 16), mask=((7, 9), bool)),
    "bool mask (N, 1, L, S)": dict(q=(2, 2, 7, 16), k=(2, 2, 9, 16), v=(2, 2, 9, 16), mask=((2, 1, 7, 9), bool)),
    "float mask (N, H, L, S)": dict(q=(2, 2, 7, 16), k=(2, 2, 9, 16), v=(2, 2, 9, 16), mask=((2, 2, 7, 9), float)),
    "float mask, 3-D": dict(q=(3, 7, 16), k=(3, 9, 16), v=(3, 9, 16), mask=((3, 7, 9), float)),
    "bool mask, 5-D": dict(q=(2, 2, 3, 5, 16), k=(2, 2, 3, 6, 16), v=(2, 2, 3, 6, 16), mask=((3, 1, 6), bool)),
}


@pytest.mark.parametrize("name", GRID)
def test_pytorch_semantics(cpu, rng, name):
    case = dict(GRID[name])
    q, k, v = (normal(rng, *case.pop(n)) for n in ("q", "k", "v"))
    mask = None
    if "mask" in case:
        shape, kind = case.pop("mask")
        mask = rng.random(shape) < 0.7 if kind is bool else normal(rng, *shape)
    y = webattn.scaled_dot_product_attention(q, k, v, mask, engine=cpu, **case)
    exact = torch_reference(q, k, v, mask, **case)
    plain = torch_reference(q, k, v, mask, dtype=np.float32, **case)
    assert y.shape == q.shape[:-1] + (v.shape[-1],) and y.dtype == np.float32
    assert_close(y, exact, plain)


def test_fully_masked_rows_are_zero(cpu, rng):
    q, k, v = normal(rng, 1, 1, 4, 16), normal(rng, 1, 1, 4, 16), normal(rng, 1, 1, 4, 16)
    mask = np.ones((4, 4), bool)
    mask[1] = False
    y = webattn.scaled_dot_product_attention(q, k, v, mask, engine=cpu)
    assert np.all(y[0, 0, 1] == 0) and np.all(np.isfinite(y))


def test_the_default_engine_is_made_once():
    assert webattn.default_engine() is webattn.default_engine()


def test_refusals_say_what_pytorch_says(cpu, rng):
    q = normal(rng, 1, 4, 5, 16)
    kv = normal(rng, 1, 2, 5, 16)
    sdpa = webattn.scaled_dot_product_attention
    with pytest.raises(webattn.OptionError, match="dropout"):
        sdpa(q, q, q, dropout_p=0.1, engine=cpu)
    with pytest.raises(webattn.OptionError, match="is_causal"):
        sdpa(q, q, q, np.ones((5, 5), bool), is_causal=True, engine=cpu)
    with pytest.raises(webattn.ShapeError, match="enable_gqa"):
        sdpa(q, kv, kv, engine=cpu)
    with pytest.raises(webattn.ShapeError, match="broadcast"):
        sdpa(q, q, q, np.ones((5, 4), bool), engine=cpu)
    with pytest.raises(webattn.ShapeError):
        sdpa(q, normal(rng, 2, 4, 5, 16), normal(rng, 2, 4, 5, 16), engine=cpu)
    with pytest.raises(webattn.ShapeError):
        sdpa(q, normal(rng, 1, 3, 5, 16), normal(rng, 1, 3, 5, 16), enable_gqa=True, engine=cpu)
    # And the engine still works.
    np.testing.assert_allclose(sdpa(q, q, q, engine=cpu), torch_reference(q, q, q), atol=1e-5)
