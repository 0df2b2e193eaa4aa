"""Configuration layering: flag > environment > file > default, with precise errors."""

from __future__ import annotations

import argparse

import pytest

from gpufleet.aggregator.config import AggregatorConfig
from gpufleet.cli import settings
from gpufleet.collector.config import CollectorConfig


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    settings.add_flags(parser, CollectorConfig, "collector")
    return parser.parse_args(list(argv))


FILE = {"collector": {"interval_s": 2, "cluster": "from-file", "node": "n-file"}}


def test_precedence_flag_over_env_over_file_over_default() -> None:
    env = {"GPUFLEET_COLLECTOR_INTERVAL_S": "3.5", "GPUFLEET_COLLECTOR_CLUSTER": "from-env"}
    cfg = settings.resolve(CollectorConfig, "collector", parse("--interval-s", "7"), env, FILE)
    assert cfg.interval_s == 7.0 and cfg.cluster == "from-env" and cfg.node == "n-file"
    assert cfg.buffer_reports == 3600, "untouched settings keep their default"
    cfg = settings.resolve(CollectorConfig, "collector", parse(), {}, FILE)
    assert cfg.interval_s == 2.0 and cfg.cluster == "from-file"


def test_booleans_from_flags_and_environment() -> None:
    assert settings.resolve(CollectorConfig, "collector", parse("--simulate"), {}, {}).simulate
    env = {"GPUFLEET_COLLECTOR_SIMULATE": "yes"}
    assert settings.resolve(CollectorConfig, "collector", parse(), env, {}).simulate
    assert not settings.resolve(CollectorConfig, "collector", parse("--no-simulate"), env, {}).simulate
    with pytest.raises(settings.ConfigError, match="GPUFLEET_COLLECTOR_SIMULATE='maybe' is not a boolean"):
        settings.resolve(CollectorConfig, "collector", parse(), {"GPUFLEET_COLLECTOR_SIMULATE": "maybe"}, {})


@pytest.mark.parametrize(
    "file_data,message",
    [
        ({"collector": {"interval_s": "fast"}}, "interval_s='fast' is not a valid float"),
        ({"collector": {"buffer_reports": 1.5}}, "buffer_reports=1.5 must be a int"),
        ({"collector": {"intervl_s": 1}}, "unknown setting(s) intervl_s in [collector]"),
        ({"collector": {"sim_model": "P100", "simulate": True}}, "sim_model='P100' is unknown"),
        ({"collector": {"aggregator": "no-port"}}, "aggregator='no-port' must be host:port"),
        ({"collector": {"ack_timeout_intervals": 0.5}}, "ack_timeout_intervals=0.5 must be 0 (off)"),
    ],
)
def test_bad_values_name_the_setting_and_the_fix(file_data: dict[str, object], message: str) -> None:
    with pytest.raises(settings.ConfigError) as info:
        settings.resolve(CollectorConfig, "collector", parse(), {}, file_data, "/etc/gpufleet/gpufleet.toml")
    assert message in str(info.value)


def test_aggregator_settings_are_checked_together() -> None:
    with pytest.raises(settings.ConfigError, match="tls_cert and tls_key must be given together"):
        settings.resolve(AggregatorConfig, "aggregator", None, {"GPUFLEET_AGGREGATOR_TLS_CERT": "c.pem"}, {})
    # Plug-in choices come from their registry (the store's: aggregator/store STORES).
    with pytest.raises(settings.ConfigError, match=r"store='mongodb': use one of embedded \(.*\), influxdb"):
        settings.resolve(AggregatorConfig, "aggregator", None, {"GPUFLEET_AGGREGATOR_STORE": "mongodb"}, {})


@pytest.mark.parametrize(
    "env,message",
    [
        # A plug-in checks its own settings, and only where they are used (a hook backend's
        # commands are needed when it is the backend, and not otherwise).
        ({"REPAIR_BACKEND": "hook"}, "repair_backend=hook needs repair_hook_cordon and repair_hook_uncordon"),
        ({"ALERT_ALERTMANAGER_REFRESH_S": "5"}, "alert_alertmanager_refresh_s=5 must be 10..3600"),
        ({"REPAIR_BACKEND": "nomad"}, "repair_backend='nomad': use one of none (gpufleet's own records"),
    ],
)
def test_a_plugin_checks_its_own_settings(env: dict[str, str], message: str) -> None:
    environ = {f"GPUFLEET_AGGREGATOR_{k}": v for k, v in env.items()}
    with pytest.raises(settings.ConfigError) as info:
        settings.resolve(AggregatorConfig, "aggregator", None, environ, {})
    assert message in str(info.value)
    hook_unused = {"GPUFLEET_AGGREGATOR_REPAIR_HOOK_CORDON": ""}  # not the backend: not needed
    assert settings.resolve(AggregatorConfig, "aggregator", None, hook_unused, {}).repair_backend == "none"


def test_every_registry_has_one_shape_and_the_settings_take_each_plugins_own() -> None:
    """Backends, sinks, stores, event sources, rules and engine parsers: each a Registry of
    named plug-ins; each plug-in's settings dataclass is part of the aggregator's settings and
    listed in the reference under the choice that uses it."""
    import dataclasses

    from gpufleet.aggregator.store import STORES
    from gpufleet.collector.sources.engines import REGISTRY as ENGINES
    from gpufleet.collector.sources.registry import EVENT_SOURCES
    from gpufleet.common.registry import Registry
    from gpufleet.repair.alerts import SINKS
    from gpufleet.repair.backends import BACKENDS
    from gpufleet.repair.rules import RULES

    registries = (STORES, BACKENDS, SINKS, EVENT_SOURCES, RULES, ENGINES)
    assert all(isinstance(r, Registry) for r in registries)
    assert list(BACKENDS) == ["none", "slurm", "kubernetes", "hook"] and "gpu_slow" in RULES
    fields = {f.name for f in dataclasses.fields(AggregatorConfig)}
    reference = settings.reference({"aggregator": AggregatorConfig})
    for registry in (STORES, BACKENDS, SINKS):
        for declared in registry.settings_classes():
            own = {f.name for f in dataclasses.fields(declared)}
            assert own <= fields, declared
            assert f"#### `[aggregator]`, with {declared.chosen_by}" in reference
    assert "`repair_slurm_scontrol`" in reference.split("with repair_backend = slurm\n")[1].split("####")[0]


def test_reference_lists_every_setting_with_its_environment_variable() -> None:
    text = settings.reference({"collector": CollectorConfig, "aggregator": AggregatorConfig})
    for name in ("interval_s", "buffer_reports", "retention_s", "max_report_bytes"):
        assert f"`{name}`" in text
    assert "`GPUFLEET_AGGREGATOR_DATA_DIR`" in text


def test_ingest_workers_default_to_one_per_core() -> None:
    """ingest_workers = -1 (the default): a worker process per core this process may use, up to
    8; 0 keeps everything in the main process; anything else out of -1..64 is refused."""
    import os

    cores = len(os.sched_getaffinity(0))
    assert settings.resolve(AggregatorConfig, "aggregator", None, {}, {}).ingest_workers == min(8, cores)
    zero = {"GPUFLEET_AGGREGATOR_INGEST_WORKERS": "0"}
    assert settings.resolve(AggregatorConfig, "aggregator", None, zero, {}).ingest_workers == 0
    with pytest.raises(settings.ConfigError, match="ingest_workers=-2 must be -1"):
        settings.resolve(
            AggregatorConfig, "aggregator", None, {"GPUFLEET_AGGREGATOR_INGEST_WORKERS": "-2"}, {}
        )
