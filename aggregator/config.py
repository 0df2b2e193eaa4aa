"""The aggregator's settings, every area's together (aggregator/settings/: serving, ingest, the
store, repair, replicas, each with its own checks), and what is derived from more than one.
Layering (file, environment, flags) is done by the CLI from the metadata on each field."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufleet.aggregator.settings import require
from gpufleet.aggregator.settings.ingest import IngestSettings
from gpufleet.aggregator.settings.plugins import PluginSettings
from gpufleet.aggregator.settings.repair import RepairSettings
from gpufleet.aggregator.settings.replicas import ReplicaSettings
from gpufleet.aggregator.settings.serving import ServingSettings
from gpufleet.aggregator.settings.store import StoreSettings
from gpufleet.aggregator.settings.workloads import WorkloadSettings
from gpufleet.aggregator.store import Store, open_store
from gpufleet.repair.alerts import open_sinks


# Fields come in the reverse order of the bases (dataclasses collect the last base's first):
# serving, ingest, store, repair, workloads, the plug-ins', replicas, as `gpufleet config reference`
# lists them.
@dataclass
class AggregatorConfig(
    ReplicaSettings,
    PluginSettings,
    WorkloadSettings,
    RepairSettings,
    StoreSettings,
    IngestSettings,
    ServingSettings,
):
    def __post_init__(self) -> None:
        self.check_serving()
        self.check_ingest()
        self.check_store()
        self.check_repair()
        self.check_workloads()
        self.check_plugins(self.store, self.repair_backend, self.workload_scheduler)
        self.check_replicas()
        # The alert sinks, opened once here so a token file that cannot be read (or any other
        # bad sink setting) stops the start with its setting named, not the first repair term.
        try:
            open_sinks(self)
        except ValueError as exc:
            require(False, str(exc))
        require(
            not self.replicated or self.store == "influxdb",
            "control_plane = postgresql (replicas) needs store = influxdb: every replica writes its "
            "streams' telemetry to one shared history (the embedded store is one box's)",
        )

    def open_store(self) -> Store:
        """The history store these settings name (the main process and each ingest worker)."""
        return open_store(
            self.store,
            self.data_path,
            self.retention_s,
            self,  # the store's own settings (influx_*) are among these
            rollup_retention={"_1m": self.rollup_1m_retention_s, "_1h": self.rollup_1h_retention_s},
        )

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def secrets_path(self) -> Path:
        return Path(self.secrets_file) if self.secrets_file else self.data_path / "secrets.toml"
