"""The corrected-error storm rule on generated nodes (the rule's own input: snapshots of GPU
samples, report after report), with the shipped policy: one GPU's storm over the window is
flagged, dips and all; a burst counts by its errors over the window; a node whose GPUs all count
errors alike has none. The slowness rule, also judged against peers, is test_slowness.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.protos import telemetry_pb2
from gpufleet.repair.policy import load_policy
from gpufleet.repair.rules import RULES
from harness.snapshots import reporting

POLICY = load_policy()


STORM = POLICY.rules["ecc_corrected_storm"]
STORM_INTERVAL_S = 5.0  # a collector's report interval


def _storm_run(samples: list[list[float]], rule: object | None = None) -> set[int | None]:
    """Each GPU's corrected-error rate at each report (samples[k][gpu], STORM_INTERVAL_S apart),
    evaluated report by report; the findings at the last."""
    rule = rule or RULES["ecc_corrected_storm"]()
    found: set[int | None] = set()
    for k, rates in enumerate(samples):
        t_ns = int((k + 1) * STORM_INTERVAL_S * 1e9)
        gpus = [telemetry_pb2.GpuSample(index=i, ecc_sbe_rate_per_s=r) for i, r in enumerate(rates)]
        found = {f.gpu for f in rule.evaluate(reporting("n1", gpus, t_ns), STORM, POLICY, t_ns)}  # type: ignore[attr-defined]
    return found


def _reports(window_s: float) -> int:
    """Reports that cover a window (and the one before its start)."""
    return int(window_s / STORM_INTERVAL_S) + 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 5), min_size=1, max_size=7),
    st.floats(150, 50_000),
    st.data(),
)
def test_one_gpus_corrected_error_storm_over_the_window_is_flagged_against_quiet_peers(
    quiet: list[float], storm: float, data: st.DataObject
) -> None:
    at = data.draw(st.integers(0, len(quiet)))
    reports = _reports(STORM.window_s)
    rates = [*quiet[:at], storm, *quiet[at:]]
    assert _storm_run([rates] * reports) == {at}
    assert _storm_run([quiet] * reports) == set()
    # Not before a whole window of it: one report short, nothing yet.
    assert _storm_run([rates] * (reports - 1)) == set()


@settings(max_examples=200, deadline=None)
@given(st.floats(150, 50_000), st.data())
def test_a_storm_that_dips_under_the_threshold_in_single_samples_is_still_found(
    storm: float, data: st.DataObject
) -> None:
    """A bursty storm: some reports fall under the threshold (down to none at all), the rate
    over the window stays above it. Judged sample by sample, each dip restarted the window and
    a real storm never lasted it."""
    reports = _reports(STORM.window_s)
    dips = data.draw(st.sets(st.integers(1, reports - 1), min_size=1, max_size=3))
    low = data.draw(st.floats(0, STORM.threshold * 0.9))
    rates = [[0.0, low if k in dips else storm, 0.0, 0.0] for k in range(reports)]
    average = sum(r[1] for r in rates[1:]) / (reports - 1)
    assert _storm_run(rates) == ({1} if average >= STORM.threshold else set())


def test_the_rate_is_over_the_window_and_a_lost_gpu_is_not_judged() -> None:
    """A burst counts by its errors over the window: 250/s for a third of it is 83/s over the
    window, under the 100/s threshold; 5000/s for a third is 1,667/s, a storm."""
    reports = _reports(STORM.window_s)
    quiet = [[0.0, 0.0, 0.0]] * (reports - reports // 3)
    assert _storm_run(quiet + [[0.0, 250.0, 0.0]] * (reports // 3)) == set()
    assert _storm_run(quiet + [[0.0, 5000.0, 0.0]] * (reports // 3)) == {1}
    rule = RULES["ecc_corrected_storm"]()
    assert _storm_run([[0.0, 5000.0, 0.0]] * reports, rule) == {1}
    lost = [telemetry_pb2.GpuSample(index=0), telemetry_pb2.GpuSample(index=1, lost=True)]
    snap = reporting("n1", lost, int((reports + 1) * STORM_INTERVAL_S * 1e9))
    assert rule.evaluate(snap, STORM, POLICY, snap.sample_time_ns) == []  # type: ignore[attr-defined]


def test_a_node_whose_gpus_all_count_errors_alike_has_no_storm() -> None:
    assert _storm_run([[400.0, 380.0, 420.0, 410.0]] * _reports(STORM.window_s)) == set()
