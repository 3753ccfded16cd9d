"""The engine's errors as Python exceptions.

Every exception the engine raises is a :class:`WebattnError`, carrying the
engine's error kind (``ShapeMismatch``, ``Limit``, ``DeviceLost``, ...) in
``kind`` and its message (sizes named, what to do) as the text. Each class
also derives from the built-in exception a Python caller would catch:
bad shapes, options and limits are ``ValueError``, dtypes ``TypeError``,
device failures ``RuntimeError``, out of memory ``MemoryError``.
"""

from __future__ import annotations


class WebattnError(Exception):
    """Any failure the engine reports; ``kind`` names the engine's error kind."""

    def __init__(self, message: str, kind: str = "Error") -> None:
        super().__init__(message)
        self.kind = kind


class ShapeError(WebattnError, ValueError):
    """A tensor's rank or shape does not fit the call (kinds ``Rank``,
    ``ShapeMismatch``, ``EmptyTensor``, ``DataLength``, ``Broadcast``,
    ``GqaHeads``)."""


class DTypeError(WebattnError, TypeError):
    """An array of a dtype the engine does not take (kind ``DType``)."""


class OptionError(WebattnError, ValueError):
    """An option out of range or options that conflict (``InvalidOption``, ``Conflict``)."""


class LimitError(WebattnError, ValueError):
    """A tensor beyond a device limit (kind ``Limit``)."""


class PagedError(WebattnError, ValueError):
    """A paged-cache operation refused (kind ``Paged``)."""


class DeviceError(WebattnError, RuntimeError):
    """The device failed or is missing (``NoAdapter``, ``RequestDevice``,
    ``DeviceLost``, ``TensorLost``, ``Gpu``, ``Readback``, ``Shader``,
    ``ForeignTensor``, ``ForeignBuffer``)."""


class OutOfMemoryError(DeviceError, MemoryError):
    """The device ran out of memory (kind ``OutOfMemory``)."""


class FileError(WebattnError, OSError):
    """A file could not be read or written (kind ``File``)."""


_CLASSES = {
    "Rank": ShapeError,
    "ShapeMismatch": ShapeError,
    "EmptyTensor": ShapeError,
    "DataLength": ShapeError,
    "Broadcast": ShapeError,
    "GqaHeads": ShapeError,
    "DType": DTypeError,
    "InvalidOption": OptionError,
    "Conflict": OptionError,
    "Limit": LimitError,
    "Paged": PagedError,
    "OutOfMemory": OutOfMemoryError,
    "File": FileError,
}


def from_kind(kind: str, message: str) -> WebattnError:
    """The exception for an engine error of ``kind`` (the native module calls this)."""
    return _CLASSES.get(kind, DeviceError)(message, kind)
