"""Arrays in and out: NumPy arrays (float32, float16, bfloat16 through
ml_dtypes, float64) and PyTorch CPU tensors, read without a copy where the
engine can take them as they are, and outputs handed back in the caller's
kind and dtype."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

from ._errors import DTypeError

_FLOAT_NAMES = ("float32", "float16", "bfloat16", "float64")
_F32 = np.dtype(np.float32)


class Operand(NamedTuple):
    """An input as the native module takes it: C-ordered float32 values,
    whether to keep it in f16 storage, and where it came from."""

    array: np.ndarray
    dtype: str
    torch: bool


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a PyTorch tensor (without importing torch)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _torch_to_numpy(x: Any) -> np.ndarray:
    t = x.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if str(t.dtype) == "torch.bfloat16":
        # NumPy has no bfloat16 of its own: widen (exactly) in torch.
        return t.float().numpy()
    # Through DLPack: a view of the tensor's memory, strides and all.
    return np.from_dlpack(t)


def float_operand(name: str, x: Any) -> Operand:
    """A float tensor input: float32 passes through untouched (the native
    side copies it once into the engine's tensor, reading any strides),
    float16 and bfloat16 are widened exactly, float64 is rounded to float32."""
    if type(x) is np.ndarray and x.dtype is _F32:
        # The common case, first and cheap: the native side reads any strides.
        return Operand(x, "float32", False)
    torch = is_torch(x)
    source_dtype = str(x.dtype).replace("torch.", "") if torch else None
    array = _torch_to_numpy(x) if torch else x
    if not isinstance(array, np.ndarray):
        raise DTypeError(
            f"{name} must be a NumPy array or a PyTorch tensor, got {type(x).__name__}",
            "DType",
        )
    dtype = source_dtype or array.dtype.name
    if dtype not in _FLOAT_NAMES:
        raise DTypeError(
            f"{name} has dtype {dtype}; expected float32, float16, bfloat16 or float64",
            "DType",
        )
    if array.dtype != np.float32:
        array = array.astype(np.float32)
    return Operand(array, dtype, torch)


def mask_operand(x: Any) -> Operand:
    """A bool mask (True = attend) or a float one (added to the scores)."""
    torch = is_torch(x)
    array = _torch_to_numpy(x) if torch else x
    if isinstance(array, np.ndarray) and array.dtype == np.bool_:
        return Operand(array, "bool", torch)
    return float_operand("attn_mask", x)


def lengths_operand(x: Any) -> np.ndarray:
    """``nonpad_kv_seqlen``: whole numbers, one per batch, as int64."""
    array = _torch_to_numpy(x) if is_torch(x) else np.asarray(x)
    if array.dtype.kind not in "iu":
        raise DTypeError(
            f"nonpad_kv_seqlen has dtype {array.dtype.name}; expected an integer array [batch]",
            "DType",
        )
    return np.ascontiguousarray(array, dtype=np.int64)


def output(array: Optional[np.ndarray], dtype: str, torch: bool) -> Any:
    """An output in the caller's dtype and kind (a torch tensor sharing the
    array's memory where the dtype is float32)."""
    if array is None:
        return None
    if not torch and dtype == "float32":
        return array
    if torch:
        import torch as _torch

        t = _torch.from_numpy(array)
        return t if dtype == "float32" else t.to(getattr(_torch, dtype))
    if dtype == "float32":
        return array
    if dtype == "bfloat16":
        import ml_dtypes

        return array.astype(ml_dtypes.bfloat16)
    return array.astype(dtype)
