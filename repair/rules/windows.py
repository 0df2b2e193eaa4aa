"""A value judged over a trailing window, not sample by sample (docs/repair.md "Rates over
windows"): a rule that asks for a rate or a level sustained over its window_s keeps each GPU's
observations and takes their time-weighted mean over the last window. One sample that dips
under the threshold lowers the mean by its share of the window; it does not restart the window,
as a finding that vanished for one evaluation would (repair/evaluator.py keeps a finding's
window only while the finding is active)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

Key = tuple[str, int]  # (node, GPU index)


@dataclass(frozen=True)
class WindowMean:
    mean: float  # time-weighted over [start_ns, end_ns]
    start_ns: int  # the window's start: what the finding is evidence since
    end_ns: int  # the newest observation's time
    observations: int  # observations inside the window


class TrailingWindows:
    """Per (node, GPU): the observations of one value over the last window, and one before it
    (so the window's start is covered). An observation (t, v) stands for the time since the
    observation before it: a collector's rate is worked out over the time since its previous
    sample, and a level seen at each evaluation is taken to have held since the last one."""

    def __init__(self) -> None:
        # node -> GPU -> (time, value, the integral of the values since the first one), oldest
        # first: a node's evaluation touches only its own; the integral makes a mean two reads.
        self._points: dict[str, dict[int, deque[tuple[int, float, float]]]] = {}

    def observe(self, key: Key, t_ns: int, value: float, window_ns: int) -> WindowMean | None:
        """Add an observation; the time-weighted mean over the window ending at it, None until
        the observations cover the whole window (a window of 0: the value itself)."""
        points = self._points.setdefault(key[0], {}).setdefault(key[1], deque())
        if points and t_ns <= points[-1][0]:
            if t_ns < points[-1][0]:
                points.clear()  # the node's clock stepped back: start again
            else:
                points.pop()  # the same report evaluated again (a full pass): its newest value
        integral = points[-1][2] + value * (t_ns - points[-1][0]) if points else 0.0
        points.append((t_ns, value, integral))
        start = t_ns - window_ns
        while len(points) > 2 and points[1][0] <= start:
            points.popleft()
        if window_ns <= 0:
            return WindowMean(value, t_ns, t_ns, 1)
        if len(points) < 2 or points[0][0] > start:
            return None
        # points[1] is after the start (kept so above): the integral up to the start is the
        # first point's plus the second's value over the part of its span before the start.
        (t0, _, i0), (_, v1, _) = points[0], points[1]
        return WindowMean((integral - i0 - v1 * (start - t0)) / window_ns, start, t_ns, len(points) - 1)

    def forget(self, key: Key) -> None:
        """The GPU left the comparison (lost, idle, no value): its window starts again."""
        gpus = self._points.get(key[0])
        if gpus is not None:
            gpus.pop(key[1], None)
            if not gpus:
                del self._points[key[0]]

    def covered_at_ns(self, node: str, window_ns: int, telling: Callable[[float], bool]) -> int | None:
        """When the earliest of this node's windows that are not yet covered and hold a value
        that could tell (a mean can pass a bound only if a value does) will be covered (None:
        none): a replay looks at the node again then, as the live controller's full passes
        would."""
        waiting = [
            points[0][0] + window_ns
            for points in self._points.get(node, {}).values()
            if points[-1][0] - points[0][0] < window_ns and any(telling(p[1]) for p in points)
        ]
        return min(waiting) if waiting else None
