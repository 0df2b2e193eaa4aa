"""Waiting on a condition with a deadline (never on a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout_s: float, what: str, poll_s: float = 0.05) -> T:
    """Return check()'s first truthy result; fail the test if none comes within timeout_s."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # the condition may not be checkable yet
            last_error = exc
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last error: {last_error}")
