"""ctypes arguments as pynvml passes them to the stand-in library."""

from __future__ import annotations

from typing import Any


def arg_value(arg: Any) -> Any:
    """The Python value of a ctypes scalar argument (c_uint(3) -> 3)."""
    return arg.value if hasattr(arg, "value") else arg


def arg_target(ref: Any) -> Any:
    """The object behind a byref() argument."""
    return ref._obj
