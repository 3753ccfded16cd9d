"""Against PyTorch itself: webattn.scaled_dot_product_attention beside
torch.nn.functional.scaled_dot_product_attention on the grid of
test_sdpa.py, its autograd beside torch's, and torch tensors through
Engine.attention. PyTorch is heavy (its PyPI wheel brings CUDA's libraries),
so these run in CI's step of their own (python/test.sh --torch), which sets
WEBATTN_REQUIRE_TORCH=1: there a missing torch fails instead of skipping."""

from __future__ import annotations

import os

import numpy as np
import pytest

if os.environ.get("WEBATTN_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import webattn  # noqa: E402
from reference import assert_close  # noqa: E402
from test_sdpa import GRID  # noqa: E402


def tensors(rng, case, dtype=torch.float32):
    q, k, v = (torch.from_numpy(rng.standard_normal(case[n])).to(dtype) for n in ("q", "k", "v"))
    mask = None
    if "mask" in case:
        shape, kind = case["mask"]
        mask = (torch.from_numpy(rng.random(shape) < 0.7) if kind is bool
                else torch.from_numpy(rng.standard_normal(shape)).to(dtype))
    options = {n: case[n] for n in ("is_causal", "scale", "enable_gqa") if n in case}
    return q, k, v, mask, options


@pytest.mark.parametrize("name", GRID)
def test_sdpa_agrees_with_pytorch(cpu, rng, name):
    q, k, v, mask, options = tensors(rng, GRID[name])
    got = webattn.scaled_dot_product_attention(q, k, v, mask, engine=cpu, **options)
    as64 = lambda t: None if t is None else (t if t.dtype == torch.bool else t.double())
    exact = F.scaled_dot_product_attention(*map(as64, (q, k, v, mask)), **options)
    plain = F.scaled_dot_product_attention(q, k, v, mask, **options)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert_close(got.numpy(), exact.numpy(), plain.numpy())


def test_fully_masked_rows_match_pytorch(cpu, rng):
    q = torch.from_numpy(rng.standard_normal((1, 2, 4, 8)).astype(np.float32))
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[1] = False
    got = webattn.scaled_dot_product_attention(q, q, q, mask, engine=cpu)
    want = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6)
    assert torch.all(got[:, :, 1] == 0)


@pytest.mark.parametrize("name", ["4-D", "gqa", "causal, L < S (top-left)", "float mask, 3-D",
                                  "bool mask, 5-D"])
def test_autograd_agrees_with_pytorch(cpu, rng, name):
    case = GRID[name]
    q, k, v, mask, options = tensors(rng, case)
    if mask is not None and mask.dtype != torch.bool:
        mask.requires_grad_(True)
    for t in (q, k, v):
        t.requires_grad_(True)
    y = webattn.scaled_dot_product_attention(q, k, v, mask, engine=cpu, **options)
    dy = torch.from_numpy(rng.standard_normal(y.shape).astype(np.float32))
    y.backward(dy)
    ours = [t.grad for t in (q, k, v, mask) if t is not None and t.requires_grad]
    leaves = [t.detach().double().requires_grad_(t.requires_grad) if t.dtype != torch.bool
              else t for t in (q, k, v) + ((mask,) if mask is not None else ())]
    ref = F.scaled_dot_product_attention(*leaves, **options)
    ref.backward(dy.double())
    theirs = [t.grad for t in leaves if t.dtype != torch.bool and t.requires_grad]
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape and a.dtype == torch.float32
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=5e-4, atol=5e-5)


def test_no_grad_and_plain_tensors_skip_autograd(cpu, rng):
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    with torch.no_grad():
        y = webattn.scaled_dot_product_attention(q, q, q, engine=cpu)
    assert y.grad_fn is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_tensors_through_engine_attention(cpu, dtype):
    q = torch.randn(1, 2, 7, 16).to(dtype)
    out = cpu.attention(q, q, q, is_causal=True, return_lse=True)
    assert out.y.dtype == dtype and out.lse.dtype == torch.float32
    want = F.scaled_dot_product_attention(q.float(), q.float(), q.float(), is_causal=True)
    np.testing.assert_allclose(out.y.float().numpy(), want.numpy(), atol=2e-2)


def test_refusals_match_pytorchs(cpu):
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(RuntimeError, match="is_causal"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(5, 5, dtype=torch.bool),
                                       is_causal=True)
    with pytest.raises(webattn.OptionError, match="is_causal"):
        webattn.scaled_dot_product_attention(q, q, q, torch.ones(5, 5, dtype=torch.bool),
                                             is_causal=True, engine=cpu)
