"""The ring across processes (webattn.distributed.ring_attention) at 2 and 4
ranks on torch.distributed's gloo backend, through the example, which checks
the gathered rows against one process's call and the f64 oracle and exits
non-zero when they disagree. Runs where torch is (python/test.sh --torch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if os.environ.get("WEBATTN_REQUIRE_TORCH") != "1":
    pytest.importorskip("torch")

from webattn.distributed import _merge  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ring_attention.py"


@pytest.mark.parametrize("args", [["--world", "2", "--tokens", "97", "--no-causal"],
                                  ["--world", "4", "--tokens", "257", "--kv-heads", "1"],
                                  ["--world", "4", "--tokens", "1000"]])
def test_the_ring_agrees_with_one_call(args):
    run = subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True,
                         timeout=300)
    print(run.stdout, run.stderr)
    assert run.returncode == 0, run.stderr
    assert "of the error allowed" in run.stdout


def test_merging_through_logsumexps_is_exact_and_keeps_empty_rows_empty():
    rng = np.random.default_rng(3)
    scores, values = rng.standard_normal((2, 10)), rng.standard_normal((10, 4))
    scores[1, :] = -np.inf  # a row that sees no key at all
    def part(cols):
        s = scores[:, cols]
        with np.errstate(invalid="ignore", divide="ignore"):
            lse = np.log(np.exp(s).sum(1))
            p = np.nan_to_num(np.exp(s - lse[:, None]))
        return (p @ values[cols])[None, None], lse[None, None]
    y, lse = _merge(*part(slice(0, 4)), *part(slice(4, 10)))
    whole_y, whole_lse = part(slice(0, 10))
    np.testing.assert_allclose(y[0, 0, 0], whole_y[0, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(lse[0, 0, 0], whole_lse[0, 0, 0], rtol=1e-6)
    assert np.all(y[0, 0, 1] == 0) and np.isneginf(lse[0, 0, 1])
