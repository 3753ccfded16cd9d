"""Engine.attention against the float64 NumPy reference: every option of the
contract, awkward sizes, dtypes, layouts and threads."""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest

import webattn
from reference import assert_close, attention


def normal(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def check(engine, q, k, v, mask=None, pk=None, pv=None, nonpad=None, **options):
    """One call against the reference; returns the worst share of the allowed error."""
    names = dict(scale="scale", softcap="softcap", is_causal="is_causal", left="left_window_size",
                 right="right_window_size", temperature="temperature", alibi="alibi")
    engine_options = {names[n]: x for n, x in options.items()}
    out = engine.attention(q, k, v, mask, pk, pv, nonpad, return_lse=True, **engine_options)
    exact, lse, _ = attention(q, k, v, mask, pk, pv, nonpad, **options)
    plain, lse32, _ = attention(q, k, v, mask, pk, pv, nonpad, dtype=np.float32, **options)
    share = assert_close(out.y, exact, plain)
    assert_close(out.lse, lse, lse32, "lse")
    return share


CASES = {
    "plain 1x1": dict(shape=(1, 1, 1, 1, 8, 8)),
    "awkward sizes": dict(shape=(2, 3, 7, 97, 16, 16)),
    "gqa, dk != dv": dict(shape=(1, 4, 9, 33, 32, 8), kv_heads=2),
    "mqa causal": dict(shape=(1, 4, 17, 17, 16, 16), kv_heads=1, is_causal=True),
    "causal top-left": dict(shape=(1, 2, 5, 13, 16, 16), is_causal=True),
    "windows": dict(shape=(1, 2, 31, 31, 16, 16), left=4, right=2),
    "softcap, large logits": dict(shape=(1, 2, 16, 40, 16, 16), softcap=20.0, logits=30.0),
    "temperature, scale": dict(shape=(1, 2, 8, 21, 16, 16), temperature=0.7, scale=0.3),
    "alibi causal": dict(shape=(1, 3, 11, 11, 16, 16), alibi=True, is_causal=True),
}


@pytest.mark.parametrize("name", CASES)
def test_options_against_the_reference(cpu, rng, name):
    case = dict(CASES[name])
    b, hq, sq, sk, d, dv = case.pop("shape")
    hkv = case.pop("kv_heads", hq)
    logits = case.pop("logits", 1.0)
    q, k = normal(rng, b, hq, sq, d, scale=logits), normal(rng, b, hkv, sk, d)
    v = normal(rng, b, hkv, sk, dv)
    check(cpu, q, k, v, **case)


@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_masks_of_every_rank(cpu, rng, rank):
    q, k, v = normal(rng, 2, 2, 5, 16), normal(rng, 2, 2, 9, 16), normal(rng, 2, 2, 9, 16)
    full = (2, 2, 5, 9)
    bool_mask = rng.random(full[-rank:]) < 0.7
    float_mask = normal(rng, *full[-rank:])
    check(cpu, q, k, v, bool_mask)
    check(cpu, q, k, v, float_mask, is_causal=True)


def test_past_and_present(cpu, rng):
    q, k, v = normal(rng, 1, 4, 3, 16), normal(rng, 1, 2, 3, 16), normal(rng, 1, 2, 3, 8)
    pk, pv = normal(rng, 1, 2, 10, 16), normal(rng, 1, 2, 10, 8)
    check(cpu, q, k, v, None, pk, pv, is_causal=True)
    out = cpu.attention(q, k, v, past_key=pk, past_value=pv, return_present=True)
    np.testing.assert_array_equal(out.present_key, np.concatenate([pk, k], axis=2))
    np.testing.assert_array_equal(out.present_value, np.concatenate([pv, v], axis=2))


def test_nonpad_lengths(cpu, rng):
    q, k, v = normal(rng, 3, 2, 4, 16), normal(rng, 3, 2, 12, 16), normal(rng, 3, 2, 12, 16)
    nonpad = np.array([12, 5, 4], np.int64)
    check(cpu, q, k, v, nonpad=nonpad, is_causal=True)


def test_fully_masked_rows_are_zero_with_lse_minus_infinity(cpu, rng):
    q, k, v = normal(rng, 1, 1, 4, 16), normal(rng, 1, 1, 6, 16), normal(rng, 1, 1, 6, 16)
    mask = np.ones((4, 6), bool)
    mask[2] = False
    out = cpu.attention(q, k, v, mask, return_lse=True, qk_matmul_output_mode=3)
    assert np.all(out.y[0, 0, 2] == 0) and np.isneginf(out.lse[0, 0, 2])
    assert np.all(out.qk_matmul_output[0, 0, 2] == 0)
    np.testing.assert_allclose(out.qk_matmul_output.sum(-1)[0, 0, [0, 1, 3]], 1, rtol=1e-5)


def test_nan_in_a_query_row_stays_in_that_row(cpu, rng):
    q, k, v = normal(rng, 1, 1, 4, 16), normal(rng, 1, 1, 6, 16), normal(rng, 1, 1, 6, 16)
    q[0, 0, 1, 3] = np.nan
    y = cpu.attention(q, k, v).y
    assert np.all(np.isnan(y[0, 0, 1])) and np.all(np.isfinite(np.delete(y[0, 0], 1, axis=0)))


def test_qk_matmul_output_modes(cpu, rng):
    q, k, v = normal(rng, 1, 2, 3, 16), normal(rng, 1, 2, 5, 16), normal(rng, 1, 2, 5, 16)
    scores = cpu.attention(q, k, v, qk_matmul_output_mode=0, scale=0.5).qk_matmul_output
    exact = (q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2)) * 0.5
    np.testing.assert_allclose(scores, exact, rtol=1e-5, atol=1e-5)
    _, _, probs = attention(q, k, v, is_causal=True)
    got = cpu.attention(q, k, v, is_causal=True, qk_matmul_output_mode=3).qk_matmul_output
    np.testing.assert_allclose(got, probs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_dtypes_come_back_as_given(cpu, rng, dtype):
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    q, k, v = (normal(rng, 1, 2, 7, 16).astype(np_dtype) for _ in range(3))
    out = cpu.attention(q, k, v, return_lse=True, return_present=True)
    assert out.y.dtype == np_dtype and out.present_value.dtype == np_dtype
    assert out.lse.dtype == np.float32
    # The engine computes on the values as given (widened exactly, or float64 rounded).
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    exact, _, _ = attention(q32, k32, v32)
    tolerance = {"float16": 2e-3, "bfloat16": 1.6e-2, "float64": 1e-5}[dtype]
    np.testing.assert_allclose(out.y.astype(np.float64), exact, atol=tolerance, rtol=tolerance)


def test_onnx_3d_inputs(cpu, rng):
    q, k, v = normal(rng, 2, 5, 4 * 8), normal(rng, 2, 7, 2 * 8), normal(rng, 2, 7, 2 * 6)
    y = cpu.attention(q, k, v, q_num_heads=4, kv_num_heads=2).y
    split = lambda x, h: x.reshape(x.shape[0], x.shape[1], h, -1).transpose(0, 2, 1, 3)
    exact, _, _ = attention(split(q, 4), split(k, 2), split(v, 2))
    assert y.shape == (2, 5, 4 * 6)
    np.testing.assert_allclose(split(y, 4), exact, rtol=1e-5, atol=1e-5)
    with pytest.raises(webattn.OptionError, match="q_num_heads"):
        cpu.attention(q, k, v)


def test_non_contiguous_arrays_read_as_their_values(cpu, rng):
    q = normal(rng, 1, 2, 16, 7).transpose(0, 1, 3, 2)  # [1, 2, 7, 16], strided
    k, v = normal(rng, 1, 2, 16, 9)[..., ::2], normal(rng, 1, 2, 5, 16)
    k = normal(rng, 1, 2, 5, 32)[..., ::2]
    assert not q.flags.c_contiguous and not k.flags.c_contiguous
    got = cpu.attention(q, k, v).y
    np.testing.assert_array_equal(got, cpu.attention(*map(np.ascontiguousarray, (q, k, v))).y)


def test_the_gpu_agrees_with_the_reference(gpu, rng):
    info = gpu.info()
    assert info["backend"] == "gpu" and "fused" in info["paths"]
    q, k, v = normal(rng, 1, 4, 97, 64), normal(rng, 1, 2, 97, 64), normal(rng, 1, 2, 97, 64)
    mask = rng.random((97, 97)) < 0.8
    for path in ("fused", "unfused"):
        out = gpu.attention(q, k, v, mask, is_causal=True, return_lse=True, path=path)
        exact, lse, _ = attention(q, k, v, mask, is_causal=True)
        plain, lse32, _ = attention(q, k, v, mask, is_causal=True, dtype=np.float32)
        assert_close(out.y, exact, plain, f"Y ({path})")
        assert_close(out.lse, lse, lse32, f"lse ({path})")


def test_threads_share_one_engine(cpu, rng):
    inputs = [tuple(normal(rng, 1, 2, 33, 16) for _ in range(3)) for _ in range(8)]
    expected = [cpu.attention(*x, is_causal=True).y for x in inputs]
    results = [None] * len(inputs)

    def run(i):
        for _ in range(3):
            results[i] = cpu.attention(*inputs[i], is_causal=True).y

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)
