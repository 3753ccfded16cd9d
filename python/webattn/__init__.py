"""webattn: attention on WebGPU compute shaders (Vulkan, Metal, DX12 through
wgpu), or on a fast CPU backend, checked against an f64 oracle.

>>> import numpy as np, webattn
>>> engine = webattn.Engine()
>>> q = np.random.default_rng(0).standard_normal((1, 8, 128, 64), dtype=np.float32)
>>> y = engine.attention(q, q, q, is_causal=True).y
>>> y.shape
(1, 8, 128, 64)
"""

from ._device import KvCache, PreparedAttention
from ._engine import AttentionGradients, AttentionOutputs, Engine
from ._layer import MultiHeadAttention
from ._serving import PagedKvCache, RaggedOutputs
from ._errors import (
    DeviceError,
    DTypeError,
    FileError,
    LimitError,
    OptionError,
    OutOfMemoryError,
    PagedError,
    ShapeError,
    WebattnError,
)
from ._sdpa import default_engine, scaled_dot_product_attention
from ._webattn import __version__

__all__ = [
    "AttentionGradients",
    "AttentionOutputs",
    "DeviceError",
    "DTypeError",
    "Engine",
    "FileError",
    "KvCache",
    "LimitError",
    "MultiHeadAttention",
    "OptionError",
    "OutOfMemoryError",
    "PagedError",
    "PagedKvCache",
    "PreparedAttention",
    "RaggedOutputs",
    "ShapeError",
    "WebattnError",
    "__version__",
    "default_engine",
    "scaled_dot_product_attention",
]
