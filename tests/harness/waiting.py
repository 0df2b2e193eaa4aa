"""Waiting on a condition with a deadline (never on a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

SEEN_CHARS = 800  # how much of the last value seen a timeout quotes


def wait_until(
    check: Callable[[], T],
    timeout_s: float,
    what: str,
    poll_s: float = 0.05,
    context: Callable[[], str] | None = None,
) -> T:
    """Return check()'s first truthy result; fail the test if none comes within timeout_s. The
    failure says what was waited for, how often it was checked, the last value the check gave
    (a list of nodes, a state: what a reader needs to tell "never came" from "came wrong") and
    the last error it raised, so a CI failure is diagnosable from its output alone; `context`,
    when given, adds what else a reader needs (the log of the process waited on)."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    last_seen: object = "(never checked without an error)"
    checks = 0
    while time.monotonic() < deadline:
        checks += 1
        try:
            result = check()
            if result:
                return result
            last_seen = result
        except Exception as exc:  # the condition may not be checkable yet
            last_error = exc
        time.sleep(poll_s)
    seen = repr(last_seen)
    seen = seen if len(seen) <= SEEN_CHARS else seen[:SEEN_CHARS] + f"... ({len(seen):,} chars)"
    error = f"{type(last_error).__name__}: {last_error}" if last_error is not None else "none"
    more = f"\n{context()}" if context is not None else ""
    raise AssertionError(
        f"timed out after {timeout_s}s waiting for {what}; checked {checks} times; "
        f"last seen: {seen}; last error: {error}{more}"
    )
