"""The signal catalog (protos/signals.py) is the one description of each signal: every
GpuSample, EngineSample and CollectorStats field is in it (or named as not a signal), and what the
collector's /metrics, the store's schema, the dashboard's node table and charts and Grafana's node
panels say of a signal is the catalog's entry. test_catalog_only_signal.py changes one entry and
finds the change on every surface a person reads."""

from __future__ import annotations

import json
import re

import pandas as pd
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.aggregator.ingest.schema import METRICS
from gpufleet.collector.metrics_endpoint import GpuMetrics
from gpufleet.dashboard.data import GPU_TABLE_HELP, HEAT_METRICS, NODE_GPU_COLUMNS, node_gpus_table
from gpufleet.dashboard.views.node import ENGINE_SERIES, GPU_SERIES
from gpufleet.protos import fleet_pb2, telemetry_pb2
from gpufleet.protos.signals import (
    COLLECTOR_SIGNALS,
    ENGINE_NOT_SIGNALS,
    ENGINE_SIGNALS,
    GPU_SIGNALS,
    NOT_SIGNALS,
    charted,
)
from harness.paths import REPO


def test_every_gpu_sample_field_has_a_catalog_entry_and_every_entry_a_field() -> None:
    fields = {f.name for f in telemetry_pb2.GpuSample.DESCRIPTOR.fields}
    missing = fields - set(GPU_SIGNALS) - NOT_SIGNALS
    assert not missing, f"GpuSample fields with no entry in protos/signals.py: {sorted(missing)}"
    assert set(GPU_SIGNALS) | NOT_SIGNALS == fields
    assert not set(GPU_SIGNALS) & NOT_SIGNALS


def test_every_engine_sample_field_has_a_catalog_entry() -> None:
    fields = {f.name for f in telemetry_pb2.EngineSample.DESCRIPTOR.fields}
    assert set(ENGINE_SIGNALS) | ENGINE_NOT_SIGNALS == fields and not set(ENGINE_SIGNALS) & ENGINE_NOT_SIGNALS
    for s in ENGINE_SIGNALS.values():
        m = METRICS[s.field]
        assert (m.measurement, m.unit, m.help, m.low, m.high) == ("engine", s.unit, s.help, s.low, s.high)
    report = telemetry_pb2.NodeReport(
        node="n1",
        cluster="c",
        engines=[telemetry_pb2.EngineSample(engine="vllm", model="m", port=8000, kv_cache_usage_ratio=0.5)],
    )
    registry = CollectorRegistry()
    registry.register(GpuMetrics(lambda: report))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    for s in ENGINE_SIGNALS.values():
        family = families[f"gpufleet_engine_{s.prometheus}"]
        assert family.documentation == s.prometheus_help
    assert [x.value for x in families["gpufleet_engine_kv_cache_usage_ratio"].samples] == [0.5]
    assert families["gpufleet_engine_requests_running"].samples == []  # not read: absent, never 0


def test_entries_are_well_formed() -> None:
    names = [s.prometheus for s in GPU_SIGNALS.values()]
    assert len(names) == len(set(names)), "two signals with one Prometheus name"
    for s in GPU_SIGNALS.values():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", s.prometheus) and not s.prometheus.endswith("_total"), s
        assert s.low < s.high and s.help and s.unit, s
        if s.prometheus_scale == 0.01:
            assert s.unit == "%" and s.prometheus.endswith("_ratio"), s
        if s.prometheus_scale == 1e6:
            assert s.unit == "MHz" and s.prometheus.endswith("_hertz"), s


def test_the_store_schema_and_the_node_table_take_the_catalogs_words() -> None:
    for s in GPU_SIGNALS.values():
        m = METRICS[s.field]
        assert (m.measurement, m.unit, m.help, m.low, m.high) == ("gpu", s.unit, s.help, s.low, s.high)
        if s.label:
            assert s.label in NODE_GPU_COLUMNS and GPU_TABLE_HELP.get(s.label), s


def test_metrics_has_one_family_per_signal_the_gpu_reports_in_base_units() -> None:
    gpu = telemetry_pb2.GpuSample(
        index=0, uuid="GPU-0", model="H100", util_gpu_pct=50.0, clock_sm_mhz=1980.0, hbm_used_bytes=1 << 30
    )
    report = telemetry_pb2.NodeReport(node="n1", cluster="c", gpus=[gpu])
    registry = CollectorRegistry()
    registry.register(GpuMetrics(lambda: report))
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for s in GPU_SIGNALS.values():
        family = families[f"gpufleet_gpu_{s.prometheus}"]
        assert family.documentation == s.prometheus_help
        assert family.type == ("counter" if s.counter else "gauge")
    gpu_families = [f for f in families.values() if f.name.startswith("gpufleet_gpu_")]
    values = {f.name: sample.value for f in gpu_families for sample in f.samples}
    # Only what the GPU reported (and `lost`, which is never absent), each in its base unit.
    assert values == {
        "gpufleet_gpu_utilization_ratio": 0.5,
        "gpufleet_gpu_sm_clock_hertz": 1.98e9,
        "gpufleet_gpu_hbm_used_bytes": float(1 << 30),
        "gpufleet_gpu_lost": 0.0,
    }


def test_the_node_table_shows_a_signal_in_its_columns_unit_and_an_absent_one_empty() -> None:
    gpu = telemetry_pb2.GpuSample(index=0, hbm_used_bytes=3 * (1 << 30) + (1 << 28), sm_active_pct=88.4)
    table = node_gpus_table(fleet_pb2.NodeSummary(node="n1", gpus=[gpu]))
    row = table.iloc[0]
    assert row["HBM used GiB"] == 3.2 and row["SMs active %"] == 88.0
    assert pd.isna(row[GPU_SIGNALS["power_w"].label])  # not reported: empty, never 0


def test_every_collector_stats_field_has_a_catalog_entry_on_metrics_and_in_the_store() -> None:
    fields = {f.name for f in telemetry_pb2.CollectorStats.DESCRIPTOR.fields}
    assert set(COLLECTOR_SIGNALS) == fields
    report = telemetry_pb2.NodeReport(
        node="n1", cluster="c", stats=telemetry_pb2.CollectorStats(reconnects_total=3, sample_duration_s=0.25)
    )
    registry = CollectorRegistry()
    registry.register(GpuMetrics(lambda: report))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    for s in COLLECTOR_SIGNALS.values():
        m = METRICS[s.field]
        assert (m.measurement, m.unit, m.help, m.low, m.high) == ("collector", s.unit, s.help, s.low, s.high)
        family = families[f"gpufleet_collector_{s.prometheus}"]
        assert (family.documentation, family.type) == (s.prometheus_help, "counter" if s.counter else "gauge")
    assert families["gpufleet_collector_reconnects"].samples[0].value == 3.0
    assert families["gpufleet_collector_sample_duration_seconds"].samples[0].value == 0.25


def test_the_charts_take_the_catalogs_titles_and_units() -> None:
    # The node page's series, the heat map's choices and Grafana's node panels are the catalog's
    # charted signals, each read in the unit its label says.
    assert charted(GPU_SIGNALS) == GPU_SERIES and charted(ENGINE_SIGNALS) == ENGINE_SERIES
    assert GPU_SERIES["HBM used GiB"].label_scale == 1 / (1 << 30)
    assert ENGINE_SERIES["KV-cache usage %"].label_scale == 100
    assert "uncorrected ECC errors (volatile)" in GPU_SERIES  # a count: no unit after it
    assert {v for v in HEAT_METRICS.values()} == {s.field for s in GPU_SIGNALS.values() if s.heat} | {
        "hbm_used_pct"
    }
    node = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "gpufleet-node.json").read_text())
    panels = {p["title"].lower(): p for p in node["panels"]}
    for s in charted(GPU_SIGNALS).values():
        panel = panels[s.title.lower()]
        assert f'("{s.field}")' in panel["targets"][0]["query"] and panel["description"] == s.help


def test_every_gpu_signal_names_its_nvml_source_and_the_reader_and_stand_in_use_it() -> None:
    """A GPU signal's entry says where it is read (shown by `gpufleet metrics`): the NVML call
    its reader makes, which the reader does make and the stand-in NVML library answers; or what
    the collector derives it from."""
    from gpufleet.collector.simnvml.library import SimulatedNvmlLibrary

    reader = (REPO / "collector" / "sources" / "nvml.py").read_text()
    answered = SimulatedNvmlLibrary.symbol_names()
    for s in GPU_SIGNALS.values():
        assert s.nvml, f"{s.field} has no NVML source"
        if s.nvml.startswith("collector: "):
            continue
        assert f"pynvml.{s.nvml}(" in reader, f"{s.field}: the reader makes no {s.nvml} call"
        # The stand-in is NVML's C library: pynvml's wrapper may call a versioned symbol (_v3).
        symbols = [n for n in answered if n == s.nvml or n.startswith(f"{s.nvml}_v")]
        assert symbols, f"{s.field}: the stand-in has no {s.nvml}"
        assert METRICS[s.field].source == s.nvml
