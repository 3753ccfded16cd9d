"""Type stubs of the native module (python/src); use the package's API instead."""

from typing import Any, Callable, Mapping, Optional

import numpy as np

__version__: str

class NativeEngine:
    def __init__(self, backend: str = "auto") -> None: ...
    def info(self) -> dict[str, Any]: ...
    def attention(
        self,
        inputs: tuple,
        *,
        f16: Optional[Mapping[str, bool]] = None,
        **options: Any,
    ) -> dict[str, np.ndarray]: ...
    def attention_backward(
        self,
        inputs: tuple,
        y: np.ndarray,
        lse: np.ndarray,
        dy: np.ndarray,
        *,
        f16: Optional[Mapping[str, bool]] = None,
        mask_gradient: bool = False,
        **options: Any,
    ) -> dict[str, np.ndarray]: ...
    def check(
        self,
        full: bool = False,
        filter: str = "",
        seed: int = 1,
        fast: bool = False,
        progress: Optional[Callable[[int, int, str], Any]] = None,
    ) -> dict[str, Any]: ...
    def attention_ragged(
        self, packed: tuple, offsets: tuple, **options: Any
    ) -> dict[str, np.ndarray]: ...
    def prepare(
        self, inputs: tuple, *, f16: Optional[Mapping[str, bool]] = None, **options: Any
    ) -> NativePrepared: ...
    def call_seconds(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, calls: int
    ) -> list[float]: ...

class NativePrepared:
    @property
    def plan(self) -> str: ...
    @property
    def workspace(self) -> tuple[int, int]: ...
    def run(
        self, inputs: tuple, *, f16: Optional[Mapping[str, bool]] = None
    ) -> dict[str, np.ndarray]: ...

class NativeKvCache:
    def __init__(self, engine: NativeEngine, capacity: int = 256) -> None: ...
    @property
    def lengths(self) -> list[int]: ...
    @property
    def capacity(self) -> int: ...
    def append(
        self,
        key: np.ndarray,
        value: np.ndarray,
        counts: Optional[list[int]] = None,
        *,
        f16: tuple[bool, bool] = (False, False),
    ) -> None: ...
    def attention(self, query: np.ndarray, *, f16: bool = False, **options: Any) -> dict[str, np.ndarray]: ...
    def present(self) -> tuple[np.ndarray, np.ndarray]: ...

class NativeMha:
    def __init__(
        self,
        engine: NativeEngine,
        weights: Mapping[str, np.ndarray],
        heads: int,
        kv_heads: int,
        rope_base: Optional[float] = None,
        rope_layout: str = "interleaved",
        f16_weights: bool = False,
    ) -> None: ...
    @property
    def dims(self) -> tuple[int, int, int, int, int, int]: ...
    def forward(
        self,
        query: np.ndarray,
        key_value: Optional[np.ndarray] = None,
        *,
        need_weights: bool = False,
        **options: Any,
    ) -> tuple[np.ndarray, Optional[np.ndarray]]: ...
    def step(
        self, x: np.ndarray, cache: NativeKvCache, *, need_weights: bool = False, **options: Any
    ) -> tuple[np.ndarray, Optional[np.ndarray]]: ...
    def serve(
        self, cache: NativePagedKvCache, steps: list[tuple[Sequence, np.ndarray]], **options: Any
    ) -> list[np.ndarray]: ...

def random_mha_weights(
    d_model: int, heads: int, head_dim: int, kv_heads: int, d_kv: int, seed: int
) -> dict[str, np.ndarray]: ...

class Sequence:
    @property
    def number(self) -> int: ...

class NativePagedKvCache:
    def __init__(
        self,
        engine: NativeEngine,
        kv_heads: int,
        head_dim: int,
        v_head_dim: int,
        page_size: int,
        page_limit: Optional[int] = None,
    ) -> None: ...
    def add_sequence(self) -> Sequence: ...
    def sequences(self) -> list[Sequence]: ...
    def length(self, seq: Sequence) -> int: ...
    def block_table(self, seq: Sequence) -> list[int]: ...
    def usage(self) -> tuple[int, int, int]: ...
    def fork(self, seq: Sequence) -> Sequence: ...
    def free(self, seq: Sequence) -> None: ...
    def append(self, items: list[tuple[Sequence, np.ndarray, np.ndarray]]) -> None: ...
    def read(self, seq: Sequence) -> tuple[np.ndarray, np.ndarray]: ...
    def attention(
        self, queries: list[tuple[Sequence, np.ndarray]], **options: Any
    ) -> list[dict[str, np.ndarray]]: ...
