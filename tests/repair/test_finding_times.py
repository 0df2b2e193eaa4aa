"""A finding's time as a person reads it (issue 55: "a finding stamped before its fault"): a
windowed rule's evidence starts at its window's start, which can be before the first sample that
crossed the threshold; what surfaces show is when it was detected, never before that sample.
The shipped ECC-storm rule on its own input (real rule, real evaluator, a real control-plane
store), then the history point the export writes for it (the node page's line, `gpufleet
events`) and the CLI's incident row (`detected` beside `first_seen`)."""

from __future__ import annotations

from pathlib import Path

from gpufleet.aggregator.fleet.export import health_points
from gpufleet.protos import telemetry_pb2
from gpufleet.repair.evaluator import Evaluator
from gpufleet.repair.policy import load_policy
from gpufleet.repair.state import Incident, Workflow, open_state
from harness.snapshots import reporting

T0_NS = 1_800_000_000 * 10**9
RULE = "ecc_corrected_storm"


def _gpus(storm_rate_per_s: float) -> list[telemetry_pb2.GpuSample]:
    """Four GPUs, GPU 2 at storm_rate_per_s corrected errors/s, its peers at none."""
    return [
        telemetry_pb2.GpuSample(
            index=i, uuid=f"GPU-{i}", ecc_sbe_rate_per_s=storm_rate_per_s if i == 2 else 0.0
        )
        for i in range(4)
    ]


def test_a_windowed_finding_is_shown_at_or_after_the_first_sample_over_its_threshold(tmp_path: Path) -> None:
    policy = load_policy()
    entry = policy.rules[RULE]
    evaluator = Evaluator(policy, open_state("sqlite", str(tmp_path / "repair.sqlite3")).kept)
    wf = Workflow("node-a")
    first_over_ns, found = None, []
    quiet_s = int(entry.window_s) * 2
    for second in range(quiet_s + int(entry.window_s) * 3):
        t = T0_NS + second * 10**9
        rate = 0.0 if second < quiet_s else entry.threshold * 20
        if rate and first_over_ns is None:
            first_over_ns = t
        found = [f for f in evaluator.evaluate(wf, reporting("node-a", _gpus(rate), t), t) if f.code == RULE]
        if found:
            break
    assert found and first_over_ns is not None, "the storm was never found"
    (finding,) = found
    assert finding.gpu == 2
    # Its evidence starts with its window, before the storm; it is detected after the storm began.
    assert finding.seen_ns < first_over_ns <= finding.detected_ns, (finding.seen_ns, first_over_ns)
    # Evaluated again a second later: still the pass that first raised it.
    later = T0_NS + (quiet_s + int(entry.window_s) * 3 + 1) * 10**9
    snap = reporting("node-a", _gpus(entry.threshold * 20), later)
    (again,) = [f for f in evaluator.evaluate(wf, snap, later) if f.code == RULE]
    assert again.detected_ns == finding.detected_ns

    (point,) = health_points(Incident("inc-1", "node-a", finding.detected_ns, findings=[finding]), "c1")
    assert point.time_unix_ns == finding.detected_ns >= first_over_ns
    assert point.fields["window_start_unix_ns"] == finding.seen_ns
    shown = finding.to_proto(evaluator.first_seen_ns(finding))
    assert shown.detected_unix_ns == finding.detected_ns and shown.first_seen_unix_ns == finding.seen_ns
