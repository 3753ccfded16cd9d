"""A float64 NumPy reference of ONNX Attention (opset 25) with the engine's
extensions (softcap, windows, nonpad, temperature, ALiBi, lse), written for
the tests from the contract (../shared/ATTENTION-CONTRACT.md), and the
tolerance rule: the engine's error against float64 at most twice a plain
float32 computation's, plus a small floor."""

from __future__ import annotations

import numpy as np


def alibi_slopes(heads: int) -> np.ndarray:
    def power_of_two(n):
        return np.array([2.0 ** (-8.0 * h / n) for h in range(1, n + 1)])

    if heads & (heads - 1) == 0:
        return power_of_two(heads)
    base = 1 << (heads.bit_length() - 1)
    return np.concatenate([power_of_two(base), power_of_two(2 * base)[::2][: heads - base]])


def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad=None, *,
              scale=None, softcap=0.0, is_causal=False, left=-1, right=-1, temperature=1.0,
              alibi=False, dtype=np.float64):
    """(Y, lse, probabilities) of one call in ``dtype`` arithmetic."""
    q, k, v = (np.asarray(x, dtype=dtype) for x in (q, k, v))
    if past_key is not None:
        k = np.concatenate([np.asarray(past_key, dtype), k], axis=2)
        v = np.concatenate([np.asarray(past_value, dtype), v], axis=2)
    b, hq, sq, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    group = hq // hkv
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    s = (q @ k.transpose(0, 1, 3, 2)) * dtype(scale if scale is not None else 1 / np.sqrt(d))
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    bias = np.zeros((b, hq, sq, t), dtype)
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.dtype == np.bool_:
            bias = bias + np.where(np.broadcast_to(m, bias.shape), 0.0, -np.inf)
        else:
            bias = bias + np.broadcast_to(m.astype(dtype), bias.shape)
    past = 0 if past_key is None else past_key.shape[2]
    j = np.arange(t)
    for bi in range(b):
        if past_key is not None:
            offset = past
        elif nonpad is not None:
            offset = int(nonpad[bi]) - sq
        else:
            offset = 0
        p = offset + np.arange(sq)[:, None]
        allowed = np.ones((sq, t), bool)
        if is_causal:
            allowed &= j[None, :] <= p
        if left >= 0:
            allowed &= j[None, :] >= p - left
        if right >= 0:
            allowed &= j[None, :] <= p + right
        if nonpad is not None:
            allowed &= j[None, :] < int(nonpad[bi])
        bias[bi] += np.where(allowed, 0.0, -np.inf)[None]
        if alibi:
            slopes = alibi_slopes(hq).astype(dtype)
            bias[bi] += -slopes[:, None, None] * np.abs(p - j[None, :])[None]
    z = (s + bias) / dtype(temperature)
    with np.errstate(invalid="ignore"):
        m = z.max(axis=-1, keepdims=True)
        masked = np.all(np.isneginf(bias), axis=-1, keepdims=True)
        e = np.exp(z - np.where(masked, 0, m))
        e = np.where(np.isneginf(z), 0, e)
        total = e.sum(axis=-1, keepdims=True)
        probs = np.where(masked, 0, e / np.where(masked, 1, total))
        lse = np.where(masked, -np.inf, np.log(np.where(masked, 1, total)) + np.where(masked, 0, m))[..., 0]
    return probs @ v, lse, probs


def assert_close(got, exact, plain32, what="Y", floor=1e-5):
    """The tolerance rule; returns the worst error as a share of the allowed."""
    got = np.asarray(got, np.float64)
    err = np.abs(got - exact)
    allowed = 2 * np.abs(np.asarray(plain32, np.float64) - exact) + floor * (1 + np.abs(exact))
    finite = np.isfinite(exact)
    assert np.array_equal(np.isfinite(got), finite), f"{what}: non-finite entries differ"
    share = float(np.max(err[finite] / allowed[finite], initial=0.0))
    assert share <= 1.0, f"{what}: worst error {err[finite].max():.3g} is {share:.2f}x the allowed"
    return share


def attention_backward(q, k, v, dy, attn_mask=None, *, scale=None, is_causal=False):
    """(dQ, dK, dV) in float64 of the call without softcap or past: dS = P ∘
    (dP − rowsum(dY ∘ Y)), dK and dV summed over each KV head's query heads."""
    y, _, p = attention(q, k, v, attn_mask, scale=scale, is_causal=is_causal)
    q, k, v, dy = (np.asarray(x, np.float64) for x in (q, k, v, dy))
    hq, hkv = q.shape[1], k.shape[1]
    group = hq // hkv
    kr, vr = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = scale if scale is not None else 1 / np.sqrt(q.shape[-1])
    dv = p.transpose(0, 1, 3, 2) @ dy
    dp = dy @ vr.transpose(0, 1, 3, 2)
    ds = p * (dp - (dy * y).sum(-1, keepdims=True))
    dq = ds @ kr * s
    dk = ds.transpose(0, 1, 3, 2) @ q * s
    fold = lambda g: g.reshape(g.shape[0], hkv, group, *g.shape[2:]).sum(2)
    return dq, fold(dk), fold(dv)
