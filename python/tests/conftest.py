import os
import zlib

import numpy as np
import pytest

import webattn


@pytest.fixture(scope="session")
def cpu():
    return webattn.Engine("cpu")


@pytest.fixture(scope="session")
def gpu():
    """The adapter (lavapipe here); a test that needs it fails, not skips,
    where WEBATTN_REQUIRE_GPU=1 (CI) and there is none."""
    try:
        return webattn.Engine("gpu")
    except webattn.DeviceError:
        if os.environ.get("WEBATTN_REQUIRE_GPU") == "1":
            raise
        pytest.skip("no GPU adapter")


@pytest.fixture
def rng(request):
    # Seeded by the test's name: each test its own inputs, the same every run.
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))
