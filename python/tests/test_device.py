"""Prepared calls and the KV cache from Python, on the CPU backend and the
adapter, against one-shot calls and the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

import webattn
from reference import assert_close, attention


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_a_prepared_call_runs_its_plan_on_new_inputs(cpu, gpu, rng, backend):
    engine = cpu if backend == "cpu" else gpu
    shapes = [(1, 4, 17, 64), (1, 2, 40, 64), (1, 2, 40, 64)]
    prepared = engine.prepare(*(normal(rng, *s) for s in shapes), is_causal=True, return_lse=True)
    assert prepared.plan and "PreparedAttention" in repr(prepared)
    for _ in range(2):
        q, k, v = (normal(rng, *s) for s in shapes)
        out = prepared.run(q, k, v)
        exact, lse, _ = attention(q, k, v, is_causal=True)
        plain, lse32, _ = attention(q, k, v, is_causal=True, dtype=np.float32)
        assert_close(out.y, exact, plain)
        assert_close(out.lse, lse, lse32, "lse")
    with pytest.raises(webattn.OptionError, match="prepared"):
        prepared.run(normal(rng, 1, 4, 18, 64), k, v)


def test_the_kv_cache_decodes_as_one_call_would(cpu, rng):
    cache = webattn.KvCache(cpu, capacity=8)
    k0, v0 = normal(rng, 2, 2, 5, 16), normal(rng, 2, 2, 5, 16)
    cache.append(k0, v0)
    keys, values = [k0], [v0]
    for step in range(12):  # past the first capacity: the cache grows
        k1, v1 = normal(rng, 2, 2, 1, 16), normal(rng, 2, 2, 1, 16)
        cache.append(k1, v1)
        keys.append(k1), values.append(v1)
        q = normal(rng, 2, 4, 1, 16)
        y = cache.attention(q, is_causal=True).y
        k, v = np.concatenate(keys, axis=2), np.concatenate(values, axis=2)
        exact, _, _ = attention(q, k, v, is_causal=True, nonpad=[k.shape[2]] * 2)
        plain, _, _ = attention(q, k, v, is_causal=True, nonpad=[k.shape[2]] * 2, dtype=np.float32)
        assert_close(y, exact, plain, f"step {step}")
    assert cache.lengths == [17, 17] and cache.capacity >= 17
    present_k, present_v = cache.present()
    np.testing.assert_array_equal(present_k, np.concatenate(keys, axis=2))
    np.testing.assert_array_equal(present_v, np.concatenate(values, axis=2))


def test_ragged_appends_and_refusals_leave_the_cache_whole(cpu, rng):
    cache = webattn.KvCache(cpu)
    k, v = normal(rng, 2, 1, 4, 8), normal(rng, 2, 1, 4, 8)
    cache.append(k, v, counts=[4, 2])
    assert cache.lengths == [4, 2]
    with pytest.raises(webattn.WebattnError):
        cache.append(normal(rng, 2, 1, 1, 16), normal(rng, 2, 1, 1, 8))  # another head size
    assert cache.lengths == [4, 2]
    y = cache.attention(normal(rng, 2, 1, 1, 8)).y
    assert y.shape == (2, 1, 1, 8) and np.all(np.isfinite(y))
