"""Ragged calls and the paged KV cache from Python, against each sequence's
call alone (the NumPy reference) and the tokens held contiguously."""

from __future__ import annotations

import numpy as np
import pytest

import webattn
from reference import assert_close, attention


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_packed_sequences_attend_only_their_own_keys(cpu, rng):
    q_lens, k_lens = [5, 0, 1, 40], [9, 3, 4, 40]
    cu_q, cu_k = np.cumsum([0] + q_lens), np.cumsum([0] + k_lens)
    q, k, v = normal(rng, cu_q[-1], 4, 16), normal(rng, cu_k[-1], 2, 16), normal(rng, cu_k[-1], 2, 8)
    out = cpu.attention_ragged(q, k, v, cu_q.astype(np.int32), cu_k, is_causal=True, softcap=4.0,
                               return_lse=True)
    assert out.y.shape == (cu_q[-1], 4, 8) and out.lse.shape == (cu_q[-1], 4)
    four = lambda x, a, b: x[a:b].transpose(1, 0, 2)[None]
    for i in range(4):
        if q_lens[i] == 0:
            continue
        args = [four(x, c[i], c[i + 1]) for x, c in ((q, cu_q), (k, cu_k), (v, cu_k))]
        exact, lse, _ = attention(*args, is_causal=True, softcap=4.0)
        plain, lse32, _ = attention(*args, is_causal=True, softcap=4.0, dtype=np.float32)
        assert_close(four(out.y, cu_q[i], cu_q[i + 1]), exact, plain, f"sequence {i}")
        assert_close(out.lse[cu_q[i]:cu_q[i + 1]].T[None], lse, lse32, f"lse {i}")
    with pytest.raises(webattn.OptionError, match="cu_seqlens_q"):
        cpu.attention_ragged(q, k, v, cu_q[:-1], cu_k[:-1])


def test_the_paged_cache_serves_forks_and_frees(cpu, rng):
    cache = webattn.PagedKvCache(cpu, kv_heads=2, head_dim=16, v_head_dim=8, page_size=16)
    a, b = cache.add_sequence(), cache.add_sequence()
    tokens = {a: ([], []), b: ([], [])}

    def append(items):
        cache.append(items)
        for s, k, v in items:
            tokens[s][0].append(k), tokens[s][1].append(v)

    append([(a, normal(rng, 2, 37, 16), normal(rng, 2, 37, 8)),
            (b, normal(rng, 2, 5, 16), normal(rng, 2, 5, 8))])
    c = cache.fork(a)  # the shared prompt, stored once
    tokens[c] = (list(tokens[a][0]), list(tokens[a][1]))
    assert cache.block_table(c) == cache.block_table(a)
    append([(c, normal(rng, 2, 1, 16), normal(rng, 2, 1, 8))])  # copy on write of the last page
    assert cache.block_table(c)[:2] == cache.block_table(a)[:2]
    assert cache.block_table(c)[2] != cache.block_table(a)[2]
    queries = [(s, normal(rng, 1, 4, 1, 16)) for s in (a, b, c)]
    outs = cache.attention(queries, is_causal=True)
    for (s, q), out in zip(queries, outs):
        k = np.concatenate(tokens[s][0], axis=1)[None]
        v = np.concatenate(tokens[s][1], axis=1)[None]
        np.testing.assert_array_equal(cache.read(s)[0], k)
        exact, _, _ = attention(q, k, v, is_causal=True, nonpad=[k.shape[2]])
        plain, _, _ = attention(q, k, v, is_causal=True, nonpad=[k.shape[2]], dtype=np.float32)
        assert_close(out.y, exact, plain, repr(s))
    in_use = cache.usage["pages_in_use"]
    cache.free(b)
    assert cache.usage["pages_in_use"] == in_use - 1
    with pytest.raises(webattn.PagedError):
        cache.append([(b, normal(rng, 2, 1, 16), normal(rng, 2, 1, 8))])
    with pytest.raises(webattn.WebattnError):  # all or nothing: a's append does not happen
        cache.append([(a, normal(rng, 2, 1, 16), normal(rng, 2, 1, 8)),
                      (c, normal(rng, 2, 1, 15), normal(rng, 2, 1, 8))])
    assert cache.length(a) == 37 and cache.length(c) == 38
    assert set(cache.sequences) == {a, c}


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_f16_pages_attend_exactly_on_their_rounded_values(backend, request, rng):
    engine = request.getfixturevalue(backend)
    cache = webattn.PagedKvCache(engine, kv_heads=2, head_dim=16, page_size=16, storage="f16")
    seqs = [cache.add_sequence() for _ in range(3)]
    kv = {s: (normal(rng, 2, n, 16), normal(rng, 2, n, 16)) for s, n in zip(seqs, [1, 20, 70])}
    cache.append([(s, k, v) for s, (k, v) in kv.items()])
    half = cache.usage["bytes"]
    queries = [(s, normal(rng, 1, 4, n, 16)) for s, n in zip(seqs, [1, 1, 3])]
    for (s, q), out in zip(queries, cache.attention(queries, is_causal=True)):
        k, v = (x.astype(np.float16).astype(np.float32)[None] for x in kv[s])
        np.testing.assert_array_equal(cache.read(s)[0], k)  # the stored values, rounded
        exact, _, _ = attention(q, k, v, is_causal=True, nonpad=[k.shape[2]])
        plain, _, _ = attention(q, k, v, is_causal=True, nonpad=[k.shape[2]], dtype=np.float32)
        assert_close(out.y, exact, plain, f"{backend} {s!r}")
    full = webattn.PagedKvCache(engine, kv_heads=2, head_dim=16, page_size=16)
    full.append([(full.add_sequence(), k, v) for k, v in kv.values()])
    assert full.usage["bytes"] == 2 * half  # the same pages at twice the bytes
    with pytest.raises(webattn.OptionError, match="storage"):
        webattn.PagedKvCache(engine, kv_heads=2, head_dim=16, storage="int4")


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_int8_pages_attend_exactly_on_their_dequantized_values(backend, request, rng):
    engine = request.getfixturevalue(backend)
    cache = webattn.PagedKvCache(engine, kv_heads=2, head_dim=16, page_size=16, storage="int8")
    seqs = [cache.add_sequence() for _ in range(3)]
    kv = {s: (normal(rng, 2, n, 16), normal(rng, 2, n, 16)) for s, n in zip(seqs, [1, 20, 70])}
    cache.append([(s, k, v) for s, (k, v) in kv.items()])
    queries = [(s, normal(rng, 1, 4, n, 16)) for s, n in zip(seqs, [1, 1, 3])]
    for (s, q), out in zip(queries, cache.attention(queries, is_causal=True)):
        k, v = cache.read(s)  # the dequantized values
        # Each value within half a step of its row's scale (max |x| / 127).
        for appended, held in zip(kv[s], (k[0], v[0])):
            step = np.abs(appended).max(axis=-1, keepdims=True) / 127
            assert np.all(np.abs(appended - held) <= step * 0.5 * (1 + 1e-6))
        exact, _, _ = attention(q, k, v, is_causal=True, nonpad=[k.shape[2]])
        plain, _, _ = attention(q, k, v, is_causal=True, nonpad=[k.shape[2]], dtype=np.float32)
        assert_close(out.y, exact, plain, f"{backend} {s!r}")
    assert cache.usage["storage"] == "int8"


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_a_layer_serves_many_sequences_as_each_alone(backend, request, rng):
    engine = request.getfixturevalue(backend)
    layer = webattn.MultiHeadAttention.random(engine, 32, 4, 8, kv_heads=2, seed=3,
                                              rope_base=10000.0)
    cache = webattn.PagedKvCache(engine, kv_heads=2, head_dim=8, page_size=16)
    seqs = [cache.add_sequence() for _ in range(3)]
    alone = [webattn.KvCache(engine) for _ in seqs]
    for tokens in ([5, 1, 12], [1, 1, 1], [3, 1, 2]):
        xs = [rng.standard_normal((1, n, 32)).astype(np.float32) for n in tokens]
        served = layer.serve(cache, list(zip(seqs, xs)))
        for out, x, own in zip(served, xs, alone):
            want, _ = layer.step(x, own)
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    assert [cache.length(s) for s in seqs] == [9, 3, 15]
    with pytest.raises(webattn.ShapeError):
        layer.serve(cache, [(seqs[0], np.zeros((1, 1, 31), np.float32))])
    assert cache.length(seqs[0]) == 9
