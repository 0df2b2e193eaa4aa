"""The aggregator's metrics, declared once (aggregator/declared_metrics.py): no count is exposed
as a gauge, and every name follows Prometheus' naming conventions. That a scrape serves exactly
this list is tested against a running aggregator in tests/project/test_prometheus_grafana.py."""

from __future__ import annotations

import re

import pytest

from gpufleet.aggregator.declared_metrics import DECLARED, counter, gauge

# A gauge's help that describes a running count: what rises only (refused, failed, dropped, runs,
# reads, restarts...) belongs in a counter. "now" / "in each" / "held" say a gauge's present state.
COUNTING = re.compile(
    r"\b(failed|failures|errors|refused|dropped|written|restarted|times|passes|reads|deliveries|"
    r"copied|timeouts|calls)\b"
)
PRESENT = re.compile(r"\b(now|held|in each|last|seconds since|1 while|1 when|1 for each|age of)\b")


def test_no_count_is_declared_as_a_gauge() -> None:
    counted = {
        name: spec.help
        for name, spec in DECLARED.items()
        if spec.kind == "gauge" and COUNTING.search(spec.help) and not PRESENT.search(spec.help)
    }
    assert not counted, f"gauges whose help describes a running count: {counted}"


def test_the_count_check_catches_a_count_declared_as_a_gauge() -> None:
    assert COUNTING.search("store writes that failed") and not PRESENT.search("store writes that failed")


def test_names_follow_prometheus_conventions() -> None:
    for name, spec in DECLARED.items():
        assert re.fullmatch(r"gpufleet_[a-z0-9_]+", name), name
        # A counter is declared without _total (prometheus_client adds it); units are base units.
        assert not name.endswith("_total"), name
        assert not re.search(r"_(ms|milliseconds|minutes|hours|kb|mb|gb|mib|gib|percent)(_|$)", name), name
        if name.endswith("_seconds"):
            assert spec.kind in ("gauge", "histogram"), name


def test_a_part_cannot_make_a_metric_that_is_not_declared_or_as_another_type() -> None:
    from prometheus_client import CollectorRegistry

    r = CollectorRegistry()
    with pytest.raises(KeyError, match="not declared as a counter"):
        counter(r, "gpufleet_made_up")
    with pytest.raises(KeyError, match="not declared as a gauge"):
        gauge(r, "gpufleet_ingest_reports_accepted")
