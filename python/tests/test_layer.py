"""webattn.MultiHeadAttention against a NumPy layer written here, and its
decoder steps through a KvCache against the whole causal sequence."""

from __future__ import annotations

import numpy as np
import pytest

import webattn
from reference import assert_close, attention


def numpy_layer(w, x, kv, heads, kv_heads, dtype=np.float64, **options):
    """Projections, attention and the output projection in ``dtype``."""
    w = {n: a.astype(dtype) for n, a in w.items()}
    x, kv = x.astype(dtype), kv.astype(dtype)
    split = lambda t, h: t.reshape(t.shape[0], t.shape[1], h, -1).transpose(0, 2, 1, 3)
    q = split(x @ w["w_q"].T + w["b_q"], heads)
    k = split(kv @ w["w_k"].T + w["b_k"], kv_heads)
    v = split(kv @ w["w_v"].T + w["b_v"], kv_heads)
    y, _, p = attention(q, k, v, dtype=dtype, **options)
    b, h, n, d = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, n, h * d) @ w["w_o"].T + w["b_o"], p


@pytest.mark.parametrize("cross", [False, True])
def test_the_layer_against_numpy(cpu, rng, cross):
    layer = webattn.MultiHeadAttention.random(cpu, 32, 4, 8, kv_heads=2, d_kv=24 if cross else None,
                                              seed=5)
    w = webattn._webattn.random_mha_weights(32, 4, 8, 2, 24 if cross else 32, 5)
    x = rng.standard_normal((2, 7, 32)).astype(np.float32)
    kv = rng.standard_normal((2, 11, 24)).astype(np.float32) if cross else x
    out, weights = layer(x, kv if cross else None, need_weights=True, is_causal=not cross)
    exact, p = numpy_layer(w, x, kv, 4, 2, is_causal=not cross)
    plain, _ = numpy_layer(w, x, kv, 4, 2, np.float32, is_causal=not cross)
    assert out.shape == (2, 7, 32) and weights.shape == (2, 4, 7, kv.shape[1])
    assert_close(out, exact, plain)
    np.testing.assert_allclose(weights, p, atol=1e-5)
    assert layer.dims["heads"] == 4 and layer.dims["kv_heads"] == 2


@pytest.mark.parametrize("rope", [None, "interleaved", "half"])
def test_decoder_steps_match_the_whole_sequence(cpu, rng, rope):
    options = {} if rope is None else {"rope_base": 10000.0, "rope_layout": rope}
    layer = webattn.MultiHeadAttention.random(cpu, 32, 4, 8, kv_heads=1, seed=9, **options)
    x = rng.standard_normal((1, 9, 32)).astype(np.float32)
    whole, _ = layer(x, is_causal=True)
    cache = webattn.KvCache(cpu)
    prompt, _ = layer.step(x[:, :4], cache)
    steps = [prompt] + [layer.step(x[:, i:i + 1], cache)[0] for i in range(4, 9)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, rtol=1e-4, atol=1e-5)
    assert cache.lengths == [9]


def test_bad_weights_are_refused(cpu):
    w = webattn._webattn.random_mha_weights(16, 2, 8, 2, 16, 1)
    del w["w_o"]
    with pytest.raises(webattn.OptionError, match="w_o"):
        webattn.MultiHeadAttention(cpu, w, 2)
    with pytest.raises(webattn.OptionError, match="rope_layout"):
        webattn.MultiHeadAttention.random(cpu, 16, 2, 8, rope_base=1e4, rope_layout="spiral")
    with pytest.raises(webattn.WebattnError):
        webattn.MultiHeadAttention.random(cpu, 16, 3, 8, kv_heads=2)
