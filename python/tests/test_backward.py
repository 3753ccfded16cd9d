"""Engine.attention_backward: the gradients against a float64 NumPy
reference written here, and against the engine's f64 oracle for the options
the reference leaves out; deterministic bit for bit; refusals."""

from __future__ import annotations

import numpy as np
import pytest

import webattn
from reference import attention_backward


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def grads(engine, q, k, v, dy, mask=None, **options):
    out = engine.attention(q, k, v, mask, return_lse=True, **options)
    return engine.attention_backward(q, k, v, out.y, out.lse, dy, mask, **options)


@pytest.mark.parametrize("case", ["plain", "gqa causal", "mask, scale, awkward"])
def test_gradients_against_the_reference(cpu, rng, case):
    hq, hkv, sq, sk, d = {"plain": (2, 2, 8, 8, 16), "gqa causal": (4, 2, 7, 7, 16),
                          "mask, scale, awkward": (3, 3, 5, 13, 8)}[case]
    q, k, v = normal(rng, 2, hq, sq, d), normal(rng, 2, hkv, sk, d), normal(rng, 2, hkv, sk, d)
    dy = normal(rng, 2, hq, sq, d)
    options = {"is_causal": case == "gqa causal"}
    mask = None
    if case.startswith("mask"):
        mask, options["scale"] = rng.random((sq, sk)) < 0.7, 0.4
    got = grads(cpu, q, k, v, dy, mask, **options)
    exact = attention_backward(q, k, v, dy, mask, **options)
    for name, g, e in zip(("dq", "dk", "dv"), got[:3], exact):
        assert g.shape == e.shape and g.dtype == np.float32
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5, err_msg=name)


def test_every_option_against_the_oracle_and_bit_for_bit(cpu, rng):
    q, k, v = normal(rng, 1, 4, 9, 16), normal(rng, 1, 2, 6, 16), normal(rng, 1, 2, 6, 8)
    pk, pv = normal(rng, 1, 2, 5, 16), normal(rng, 1, 2, 5, 8)
    mask, dy = normal(rng, 9, 11), normal(rng, 1, 4, 9, 8)
    options = dict(is_causal=True, softcap=3.0, temperature=0.8, alibi=True, left_window_size=6)
    fwd = cpu.attention(q, k, v, mask, pk, pv, return_lse=True, **options)
    run = lambda path: cpu.attention_backward(q, k, v, fwd.y, fwd.lse, dy, mask, pk, pv,
                                              mask_gradient=True, path=path, **options)
    got, again, oracle = run("auto"), run("auto"), run("oracle")
    for name in got._fields:
        np.testing.assert_allclose(getattr(got, name), getattr(oracle, name), rtol=1e-4,
                                   atol=1e-5, err_msg=name)
        assert getattr(got, name).tobytes() == getattr(again, name).tobytes(), name
    assert got.d_past_key.shape == pk.shape and got.d_mask.shape == mask.shape


def test_the_gpu_backward_agrees(gpu, rng):
    q, k, v = normal(rng, 1, 2, 33, 64), normal(rng, 1, 2, 33, 64), normal(rng, 1, 2, 33, 64)
    dy = normal(rng, 1, 2, 33, 64)
    got = grads(gpu, q, k, v, dy, is_causal=True)
    exact = attention_backward(q, k, v, dy, is_causal=True)
    for name, g, e in zip(("dq", "dk", "dv"), got[:3], exact):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=5e-5, err_msg=name)


def test_refusals_name_the_tensor(cpu, rng):
    q = normal(rng, 1, 2, 5, 16)
    fwd = cpu.attention(q, q, q, return_lse=True)
    with pytest.raises(webattn.ShapeError, match="dY"):
        cpu.attention_backward(q, q, q, fwd.y, fwd.lse, normal(rng, 1, 2, 4, 16))
    with pytest.raises(webattn.ShapeError, match="lse"):
        cpu.attention_backward(q, q, q, fwd.y, fwd.lse[..., :3], fwd.y)
    with pytest.raises(webattn.OptionError, match="is_casual"):
        cpu.attention_backward(q, q, q, fwd.y, fwd.lse, fwd.y, is_casual=True)
