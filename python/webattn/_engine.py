"""``webattn.Engine``: the ONNX ``Attention`` operator (opset 25) on a GPU
through wgpu, or on the fast CPU backend, from NumPy arrays or PyTorch CPU
tensors."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from . import _webattn
from ._arrays import Operand, float_operand, lengths_operand, mask_operand, output
from ._errors import OptionError


class AttentionOutputs(NamedTuple):
    """The outputs of one call; those not asked for are ``None``."""

    y: Any
    """``[B, Hq, Sq, Dv]`` (or ``[B, Sq, Hq·Dv]`` for 3-D inputs), in Q's dtype."""
    present_key: Any = None
    """``[B, Hkv, P + Sk, D]``: the past with K appended (``return_present=True``)."""
    present_value: Any = None
    """``[B, Hkv, P + Sk, Dv]``, in V's dtype (``return_present=True``)."""
    qk_matmul_output: Any = None
    """``[B, Hq, Sq, P + Sk]`` in the mode asked (``qk_matmul_output_mode``)."""
    lse: Any = None
    """``[B, Hq, Sq]`` float32 row logsumexp (``return_lse=True``); ``-inf`` where a row is fully masked."""


class AttentionGradients(NamedTuple):
    """The gradients of one call's inputs; those that do not exist are ``None``."""

    dq: Any
    """``[B, Hq, Sq, D]``, in Q's dtype."""
    dk: Any
    """``[B, Hkv, Sk, D]``, summed over each KV head's query heads, in K's dtype."""
    dv: Any
    """``[B, Hkv, Sk, Dv]``, summed likewise, in V's dtype."""
    d_past_key: Any = None
    """``[B, Hkv, P, D]`` where the call had a past."""
    d_past_value: Any = None
    """``[B, Hkv, P, Dv]`` where the call had a past."""
    d_mask: Any = None
    """The float mask's gradient in its own shape (``mask_gradient=True``), float32."""


def _split_heads(op: Operand, heads: Optional[int], option: str) -> Operand:
    """ONNX's 3-D form ``[B, S, H·d]`` as ``[B, H, S, d]``."""
    if op.array.ndim != 3:
        return op
    if heads is None:
        raise OptionError(
            f"option {option} = missing is invalid: 3-D inputs [batch, sequence, heads·head size] "
            "need q_num_heads and kv_num_heads (ONNX's attributes)",
            "InvalidOption",
        )
    b, s, hd = op.array.shape
    if heads <= 0 or hd % heads:
        raise OptionError(
            f"option {option} = {heads} is invalid: the head count must be positive and divide "
            f"the last dimension {hd} of the 3-D input",
            "InvalidOption",
        )
    four = op.array.reshape(b, s, heads, hd // heads).transpose(0, 2, 1, 3)
    return op._replace(array=np.ascontiguousarray(four))


def _f16_flags(q: Operand, k: Operand, v: Operand, pk: Optional[Operand],
               pv: Optional[Operand]) -> Optional[dict]:
    """Which tensors to keep in f16 storage; ``None`` (cheaper) when none."""
    if "float16" not in (q.dtype, k.dtype, v.dtype, pk and pk.dtype, pv and pv.dtype):
        return None
    return {
        "q": q.dtype == "float16",
        "k": k.dtype == "float16",
        "v": v.dtype == "float16",
        "past_key": pk is not None and pk.dtype == "float16",
        "past_value": pv is not None and pv.dtype == "float16",
    }


class _Call(NamedTuple):
    """A call's inputs read: the operands whose dtypes the outputs follow,
    the seven arrays the native side takes, and which to keep in f16."""

    q: Operand
    k: Operand
    v: Operand
    past_key: Optional[Operand]
    past_value: Optional[Operand]
    arrays: tuple
    f16: Optional[dict]
    three_d: bool


def _read_call(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, heads) -> _Call:
    """Reads a call's inputs; ``heads`` = ``(q_num_heads, kv_num_heads)``
    splits ONNX's 3-D inputs (``None``: 4-D only)."""
    qo, ko, vo = float_operand("Q", q), float_operand("K", k), float_operand("V", v)
    three_d = qo.array.ndim == 3
    if heads is not None:
        qo = _split_heads(qo, heads[0], "q_num_heads")
        ko = _split_heads(ko, heads[1], "kv_num_heads")
        vo = _split_heads(vo, heads[1], "kv_num_heads")
    pk = float_operand("past_key", past_key) if past_key is not None else None
    pv = float_operand("past_value", past_value) if past_value is not None else None
    mask = mask_operand(attn_mask).array if attn_mask is not None else None
    nonpad = lengths_operand(nonpad_kv_seqlen) if nonpad_kv_seqlen is not None else None
    arrays = (qo.array, ko.array, vo.array, mask, pk and pk.array, pv and pv.array, nonpad)
    return _Call(qo, ko, vo, pk, pv, arrays, _f16_flags(qo, ko, vo, pk, pv), three_d)


def _given_options(scale, softcap, is_causal, left_window_size, right_window_size,
                   qk_matmul_output_mode, softmax_precision, return_lse, return_present,
                   temperature, alibi, path, precision) -> dict:
    """The options that differ from their defaults (fewer for the native
    side to read: a call's overhead is counted in microseconds)."""
    given = {}
    if scale is not None:
        given["scale"] = scale
    if softcap != 0.0:
        given["softcap"] = softcap
    if is_causal:
        given["is_causal"] = is_causal
    if left_window_size != -1:
        given["left_window_size"] = left_window_size
    if right_window_size != -1:
        given["right_window_size"] = right_window_size
    if qk_matmul_output_mode is not None:
        given["qk_matmul_output_mode"] = qk_matmul_output_mode
    if softmax_precision is not None:
        given["softmax_precision"] = softmax_precision
    if return_lse:
        given["return_lse"] = return_lse
    if return_present:
        given["return_present"] = return_present
    if temperature != 1.0:
        given["temperature"] = temperature
    if alibi:
        given["alibi"] = alibi
    if path != "auto":
        given["path"] = path
    if precision != "highest":
        given["precision"] = precision
    return given


def _merge_heads(y: np.ndarray) -> np.ndarray:
    b, h, s, d = y.shape
    return np.ascontiguousarray(y.transpose(0, 2, 1, 3)).reshape(b, s, h * d)


class Engine:
    """An attention engine on one device, or on the CPU backend.

    ``backend``: ``"auto"`` (a GPU where there is one and it is faster than the
    CPU backend; the CPU backend otherwise), ``"gpu"`` (an adapter, or
    :class:`DeviceError`) or ``"cpu"``. Create one and keep it: kernels are
    compiled once per engine. An engine may be shared by threads; each call
    releases the GIL while it runs.
    """

    def __init__(self, backend: str = "auto") -> None:
        self._native = _webattn.NativeEngine(backend)

    def info(self) -> dict:
        """What the engine runs on: ``backend``, ``description``, ``paths``, ``cpu_reason``."""
        return self._native.info()

    def __repr__(self) -> str:
        return repr(self._native)

    def attention(
        self,
        q: Any,
        k: Any,
        v: Any,
        attn_mask: Any = None,
        past_key: Any = None,
        past_value: Any = None,
        nonpad_kv_seqlen: Any = None,
        *,
        q_num_heads: Optional[int] = None,
        kv_num_heads: Optional[int] = None,
        scale: Optional[float] = None,
        softcap: float = 0.0,
        is_causal: bool = False,
        left_window_size: int = -1,
        right_window_size: int = -1,
        qk_matmul_output_mode: Optional[int] = None,
        softmax_precision: Optional[int] = None,
        return_lse: bool = False,
        return_present: bool = False,
        temperature: float = 1.0,
        alibi: bool = False,
        path: str = "auto",
        precision: str = "highest",
    ) -> AttentionOutputs:
        """One call of ONNX ``Attention`` (opset 25), with its inputs and
        attributes under ONNX's names.

        Q ``[B, Hq, Sq, D]``, K ``[B, Hkv, Sk, D]``, V ``[B, Hkv, Sk, Dv]`` (or
        ONNX's 3-D ``[B, S, H·d]`` with ``q_num_heads``/``kv_num_heads``);
        ``attn_mask`` bool (True = attend) or float (added), broadcast
        right-aligned to ``[B, Hq, Sq, P + Sk]``; ``past_key``/``past_value``
        ``[B, Hkv, P, ·]``; ``nonpad_kv_seqlen`` int ``[B]``. Beyond ONNX:
        ``return_lse``, ``temperature``, ``alibi``, ``path`` (``auto``,
        ``fused``, ``unfused``, ``cpu``, ``oracle``) and ``precision``
        (``highest``, or ``fast``: f16 products on matrix units).

        Arrays may be float32, float16, bfloat16 (ml_dtypes) or float64 NumPy
        arrays or PyTorch CPU tensors; outputs come back in the same kind, in
        Q's dtype (V's for ``present_value``; the logsumexp in float32).
        """
        call = _read_call(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen,
                          (q_num_heads, kv_num_heads))
        qo, vo = call.q, call.v
        out = self._native.attention(
            call.arrays,
            f16=call.f16,
            **_given_options(scale, softcap, is_causal, left_window_size, right_window_size,
                             qk_matmul_output_mode, softmax_precision, return_lse,
                             return_present, temperature, alibi, path, precision),
        )
        y = out["y"]
        if call.three_d:
            y = _merge_heads(y)
        if len(out) == 1 and qo.dtype == "float32" and not qo.torch:
            return AttentionOutputs(y)
        like_q = (qo.dtype, qo.torch)
        like_v = (vo.dtype, vo.torch)
        return AttentionOutputs(
            y=output(y, *like_q),
            present_key=output(out.get("present_key"), *like_q),
            present_value=output(out.get("present_value"), *like_v),
            qk_matmul_output=output(out.get("qk_matmul_output"), *like_q),
            lse=output(out.get("lse"), "float32", qo.torch),
        )

    def attention_backward(
        self,
        q: Any,
        k: Any,
        v: Any,
        y: Any,
        lse: Any,
        dy: Any,
        attn_mask: Any = None,
        past_key: Any = None,
        past_value: Any = None,
        nonpad_kv_seqlen: Any = None,
        *,
        mask_gradient: bool = False,
        **options: Any,
    ) -> AttentionGradients:
        """The gradients of the call ``attention(q, k, v, attn_mask, past_key,
        past_value, nonpad_kv_seqlen, **options)`` (4-D inputs), given its
        ``y``, its logsumexp ``lse`` (``return_lse=True``) and ``dy``, the
        loss's gradient with respect to Y: FlashAttention-2's backward, the
        probabilities recomputed from ``lse`` and never stored, deterministic
        bit for bit. ``options`` are the forward's, by the same names.
        ``mask_gradient`` also returns a float mask's gradient. Shapes of
        ``y``, ``lse`` or ``dy`` that are not the forward's raise
        :class:`ShapeError` naming the tensor.
        """
        call = _read_call(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, None)
        qo, ko, vo, pk, pv = call.q, call.k, call.v, call.past_key, call.past_value
        y_, lse_, dy_ = (float_operand(n, x).array for n, x in (("Y", y), ("lse", lse), ("dY", dy)))
        out = self._native.attention_backward(
            call.arrays, y_, lse_, dy_, f16=call.f16, mask_gradient=mask_gradient, **options
        )
        return AttentionGradients(
            dq=output(out["dq"], qo.dtype, qo.torch),
            dk=output(out["dk"], ko.dtype, ko.torch),
            dv=output(out["dv"], vo.dtype, vo.torch),
            d_past_key=output(out.get("d_past_key"), pk.dtype, pk.torch) if pk else None,
            d_past_value=output(out.get("d_past_value"), pv.dtype, pv.torch) if pv else None,
            d_mask=output(out.get("d_mask"), "float32", qo.torch),
        )

    def attention_ragged(self, q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
                         **options: Any) -> "RaggedOutputs":
        """Packed sequences without padding (FlashAttention's varlen form):
        ``q`` ``[total_q, Hq, Dk]``, ``k`` ``[total_k, Hkv, Dk]``, ``v``
        ``[total_k, Hkv, Dv]``, sequence ``i`` the rows
        ``cu_seqlens_*[i]:cu_seqlens_*[i + 1]`` (integer offsets, batch + 1
        of them, from 0 to the packed rows), each attending only its own
        keys, with :meth:`attention`'s options (not the mask, past, padding
        or qk output). Returns ``RaggedOutputs(y, lse)`` packed as ``q``."""
        from ._serving import attention_ragged

        return attention_ragged(self, q, k, v, cu_seqlens_q, cu_seqlens_k, **options)

    def prepare(
        self,
        q: Any,
        k: Any,
        v: Any,
        attn_mask: Any = None,
        past_key: Any = None,
        past_value: Any = None,
        nonpad_kv_seqlen: Any = None,
        **options: Any,
    ) -> "PreparedAttention":
        """Plans the call for the shapes and dtypes of these inputs and
        ``options`` (:meth:`attention`'s, by name) once: every
        ``prepared.run(...)`` takes that plan (``prepared.plan`` says what it
        is and why) and reuses its workspace on the device."""
        from ._device import PreparedAttention

        call = _read_call(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, None)
        return PreparedAttention(self._native.prepare(call.arrays, f16=call.f16, **options))

    def check(
        self,
        full: bool = False,
        *,
        filter: str = "",
        seed: int = 1,
        fast: bool = False,
        progress: Optional[Callable[[int, int, str], None]] = None,
    ) -> dict:
        """The conformance sweep against the f64 oracle on every path the
        engine has (``full``: every mask form, GQA ratio and awkward size;
        else the quick sweep). Returns ``passed``, ``failed``,
        ``worst_share_of_allowed`` (the worst error as a share of the error
        the tolerance rule allows), a printable ``table`` and per-case
        ``results``. ``progress(done, total, case)`` is called after each case.
        """
        return self._native.check(full, filter, seed, fast, progress)
