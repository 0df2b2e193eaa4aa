"""The peer-relative rules on generated nodes (the rule's own input: snapshots of GPU samples),
with the shipped policy: in fleets of identical busy GPUs with measurement noise the slowness
rule never flags a GPU; with one GPU slowed it flags that one and only that one. The storm rule
flags one GPU's storm and not a node whose GPUs all count errors alike."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.protos import telemetry_pb2, vocabulary_pb2
from gpufleet.repair.model import NodeSnapshot
from gpufleet.repair.policy import load_policy
from gpufleet.repair.rules import RULES

POLICY = load_policy()
MAX_SM_MHZ, POWER_W = 1980.0, 665.0


def _node(gpus: list[telemetry_pb2.GpuSample]) -> NodeSnapshot:
    return NodeSnapshot(
        "n1",
        "c",
        vocabulary_pb2.LIVENESS_REPORTING,
        0.5,
        "boot",
        True,
        len(gpus),
        gpus={g.index: g for g in gpus},
        sample_time_ns=1,
    )


def _fleet(seed: int, count: int, clock_noise: float, power_noise: float) -> list[telemetry_pb2.GpuSample]:
    """Identical GPUs on the same work: util 90-100 %, SM clock and power with relative noise."""
    rng = random.Random(seed)
    return [
        telemetry_pb2.GpuSample(
            index=i,
            model="NVIDIA H100 80GB HBM3",
            util_gpu_pct=rng.uniform(90, 100),
            clock_sm_mhz=round(MAX_SM_MHZ * (1 + rng.gauss(0, clock_noise))),
            power_w=POWER_W * (1 + rng.gauss(0, power_noise)),
            clock_event_reasons=0,
        )
        for i in range(count)
    ]


def _slow_findings(gpus: list[telemetry_pb2.GpuSample]) -> set[int | None]:
    rule = RULES["gpu_slow"]()
    return {f.gpu for f in rule.evaluate(_node(gpus), POLICY.rules["gpu_slow"], POLICY, 1)}


fleets = st.tuples(
    st.integers(0, 2**32),
    st.integers(3, 8),
    st.floats(0, 0.01),  # SM clock noise, relative (boost clocks move in ~15 MHz bins)
    st.floats(0, 0.015),  # power noise, relative
)


@settings(max_examples=300, deadline=None)
@given(fleets)
def test_identical_gpus_with_noise_are_never_flagged(fleet: tuple[int, int, float, float]) -> None:
    assert _slow_findings(_fleet(*fleet)) == set()


@settings(max_examples=300, deadline=None)
@given(fleets, st.data(), st.floats(0.5, 0.85), st.sampled_from(["clock_sm_mhz", "power_w", "both"]))
def test_one_slowed_gpu_is_flagged_and_only_it(
    fleet: tuple[int, int, float, float], data: st.DataObject, factor: float, what: str
) -> None:
    gpus = _fleet(*fleet)
    slowed = data.draw(st.integers(0, len(gpus) - 1))
    for field in ("clock_sm_mhz", "power_w") if what == "both" else (what,):
        setattr(gpus[slowed], field, getattr(gpus[slowed], field) * factor)
    assert _slow_findings(gpus) == {slowed}


def test_a_gpu_slowed_for_a_named_reason_or_idle_is_not_a_gray_failure() -> None:
    gpus = _fleet(1, 8, 0.002, 0.005)
    gpus[2].clock_sm_mhz *= 0.6
    gpus[2].clock_event_reasons = 0x20  # SW thermal slowdown: thermal_slowdown's finding
    gpus[5].power_w *= 0.6
    gpus[5].util_gpu_pct = 40  # not the same work as its peers
    assert _slow_findings(gpus) == set()


def _storm_findings(rates: list[float]) -> set[int | None]:
    gpus = [telemetry_pb2.GpuSample(index=i, ecc_sbe_rate_per_s=r) for i, r in enumerate(rates)]
    rule = RULES["ecc_corrected_storm"]()
    return {f.gpu for f in rule.evaluate(_node(gpus), POLICY.rules["ecc_corrected_storm"], POLICY, 1)}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 5), min_size=1, max_size=7),
    st.floats(150, 50_000),
    st.data(),
)
def test_one_gpus_corrected_error_storm_is_flagged_against_quiet_peers(
    quiet: list[float], storm: float, data: st.DataObject
) -> None:
    at = data.draw(st.integers(0, len(quiet)))
    rates = [*quiet[:at], storm, *quiet[at:]]
    assert _storm_findings(rates) == {at}
    assert _storm_findings(quiet) == set()


def test_a_node_whose_gpus_all_count_errors_alike_has_no_storm() -> None:
    assert _storm_findings([400.0, 380.0, 420.0, 410.0]) == set()
