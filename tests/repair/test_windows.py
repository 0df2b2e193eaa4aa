"""The trailing window the rate and slowness rules judge by (repair/rules/windows.py): its mean,
kept as a running integral, equals the time-weighted mean worked out from every observation, for
any sequence of observations and any window; a window is judged only once covered."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.repair.rules.windows import TrailingWindows

NS = 1_000_000_000


def _mean_from_all(observations: list[tuple[int, float]], window_ns: int) -> float | None:
    """Each value held since the observation before it; the mean over the window ending at the
    last one, from every observation (None unless one is at or before the window's start)."""
    end = observations[-1][0]
    start = end - window_ns
    if observations[0][0] > start:
        return None
    total = 0.0
    for (t0, _), (t1, value) in pairwise(observations):
        low, high = max(t0, start), t1
        if high > low:
            total += value * (high - low)
    return total / window_ns


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40 * NS), st.floats(0, 1e5)), min_size=1, max_size=60),
    st.integers(NS, 200 * NS),  # a second or more: the windows a policy gives (the running
    # integral, in value x ns, loses digits against a window of nanoseconds)
)
def test_the_running_mean_equals_the_mean_from_every_observation(
    steps: list[tuple[int, float]], window_ns: int
) -> None:
    windows, observations, t = TrailingWindows(), [], 0
    for dt, value in steps:
        t += dt
        observations.append((t, value))
        over = windows.observe(("n", 0), t, value, window_ns)
        want = _mean_from_all(observations, window_ns)
        if want is None:
            assert over is None
        else:
            assert over is not None and over.start_ns == t - window_ns and over.end_ns == t
            assert abs(over.mean - want) <= 1e-6 * max(1.0, abs(want)), (over.mean, want)


def test_the_same_report_seen_again_counts_once_and_a_clock_step_back_starts_again() -> None:
    windows = TrailingWindows()
    for t_s, value in ((0, 5.0), (10, 5.0), (10, 5.0), (20, 5.0)):
        over = windows.observe(("n", 1), t_s * NS, value, 20 * NS)
    assert over is not None and over.mean == 5.0 and over.observations == 2
    assert windows.observe(("n", 1), 15 * NS, 1.0, 20 * NS) is None  # back in time: no window yet
    windows.forget(("n", 1))
    assert windows.covered_at_ns("n", 20 * NS, lambda v: True) is None
    windows.observe(("n", 1), 100 * NS, 9.0, 20 * NS)
    windows.observe(("n", 2), 105 * NS, 0.0, 20 * NS)
    # A replay looks again when the window that could tell (a value past the bound) is covered.
    assert windows.covered_at_ns("n", 20 * NS, lambda v: v > 1) == 120 * NS
    assert windows.covered_at_ns("n", 20 * NS, lambda v: v > 10) is None
