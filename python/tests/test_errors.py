"""Bad input raises the documented exception (a webattn.WebattnError that is
also the built-in a caller would catch) with the engine's message, and the
engine keeps working after it."""

from __future__ import annotations

import numpy as np
import pytest

import webattn


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_every_refusal_is_typed_and_harmless(cpu, rng):
    q, k, v = normal(rng, 1, 2, 5, 16), normal(rng, 1, 2, 6, 16), normal(rng, 1, 2, 6, 16)
    bad = [
        (webattn.ShapeError, "Rank", lambda: cpu.attention(q[0, 0], k, v)),
        (webattn.ShapeError, "ShapeMismatch", lambda: cpu.attention(q, normal(rng, 2, 2, 6, 16), v)),
        (webattn.ShapeError, "GqaHeads", lambda: cpu.attention(normal(rng, 1, 3, 5, 16), k, v)),
        (webattn.ShapeError, None, lambda: cpu.attention(q, k, v, np.ones((5, 7, 3), bool))),
        (webattn.DTypeError, "DType", lambda: cpu.attention(q.astype(np.int32), k, v)),
        (webattn.DTypeError, "DType", lambda: cpu.attention("q", k, v)),
        (webattn.DTypeError, "DType", lambda: cpu.attention(q, k, v, nonpad_kv_seqlen=np.ones(1))),
        (webattn.OptionError, "InvalidOption", lambda: cpu.attention(q, k, v, softcap=-1.0)),
        (webattn.OptionError, "InvalidOption", lambda: cpu.attention(q, k, v, qk_matmul_output_mode=7)),
        (webattn.OptionError, "InvalidOption", lambda: cpu.attention(q, k, v, path="warp")),
        (webattn.OptionError, "InvalidOption", lambda: cpu.attention(q, k, v, temperature=0.0)),
        (webattn.OptionError, None, lambda: cpu.attention(q, k, v, past_key=k)),
        (webattn.OptionError, None, lambda: cpu.attention(q, k, v, None, k, v, np.array([6]))),
    ]
    for cls, kind, call in bad:
        with pytest.raises(cls) as caught:
            call()
        assert isinstance(caught.value, webattn.WebattnError)
        assert kind is None or caught.value.kind == kind, (caught.value.kind, str(caught.value))
        assert str(caught.value)
    assert issubclass(webattn.ShapeError, ValueError)
    assert issubclass(webattn.DTypeError, TypeError)
    assert issubclass(webattn.DeviceError, RuntimeError)
    # Nothing the caller passed changed, and the engine still computes.
    before = q.copy()
    cpu.attention(q, k, v)
    np.testing.assert_array_equal(q, before)


def test_an_unknown_backend_is_an_option_error():
    with pytest.raises(webattn.OptionError, match="backend"):
        webattn.Engine("tpu")


def test_the_conformance_check_runs_and_reports(cpu):
    seen = []
    report = cpu.check(filter="causal", progress=lambda done, total, name: seen.append((done, total)))
    assert report["failed"] == 0 and report["passed"] > 0, report["table"]
    assert seen and seen[-1][0] == seen[-1][1] == len(report["results"])
    assert 0 < report["worst_share_of_allowed"] <= 1
    assert all(r["passed"] for r in report["results"])


def test_a_progress_callback_that_raises_stops_nothing_but_is_reported(cpu):
    def progress(done, total, name):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        cpu.check(filter="causal", progress=progress)
    assert cpu.attention(*(np.ones((1, 1, 2, 4), np.float32),) * 3).y.shape == (1, 1, 2, 4)
