"""The collector's settings. Layering (file, environment, flags) is done by the CLI from
the metadata on each field; here they are typed and checked."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from gpufleet.collector.simnvml import GPU_PROFILES
from gpufleet.collector.simnvml.engine_server import ENGINES as SIMULATED_ENGINES
from gpufleet.collector.sources.engines import REGISTRY as ENGINE_PARSERS
from gpufleet.collector.sources.engines.scrape import parse_endpoints
from gpufleet.common.net import is_loopback
from gpufleet.protos.credentials import SHARED_SECRET_TOKEN_ID, collector_token, node_name_problem

# What /metrics may serve (collector/metrics_endpoint.py, collector/dcgm_face.py).
METRICS_NAMES = ("gpufleet", "dcgm", "both")


def _setting(default: Any, help_text: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help_text, **kw})


@dataclass
class CollectorConfig:
    aggregator: str = _setting(
        "127.0.0.1:7710",
        "aggregator ingest address, host:port; several, comma-separated, for replicas: the collector "
        "starts at one (by its node name, spreading the fleet) and moves to the next when a stream "
        "breaks. One DNS name with several records works too (gRPC tries each address)",
    )
    node: str = _setting(socket.gethostname(), "this node's name (default: the hostname)")
    cluster: str = _setting("default", "cluster this node belongs to")
    token: str = _setting(
        "",
        "collector credential bound to this node (prefer token_file or the environment)",
        secret=True,
    )
    token_file: str = _setting("", "file holding the collector credential")
    secret_file: str = _setting(
        "",
        "file holding the fleet's collector secret: derive this node's credential from it. Any host "
        "holding the secret can report as every node, so it needs allow_shared_secret = true; prefer a "
        "per-node token_file (bare metal) or the projected ServiceAccount token (Kubernetes)",
    )
    allow_shared_secret: bool = _setting(
        False, "opt in to secret_file, knowing one compromised node could then report as any other"
    )
    interval_s: float = _setting(5.0, "seconds between samples")
    columnar_gpus: bool = _setting(
        True,
        "send the GPU samples as columns (one array per field), which the aggregator checks and "
        "stores in bulk; used only with an aggregator that says it takes them",
    )
    buffer_reports: int = _setting(
        3600,
        "unacknowledged reports kept for replay; the oldest is dropped (and counted) beyond this",
    )
    simulate: bool = _setting(False, "use simulated GPUs from the stand-in NVML instead of the driver")
    sim_gpus: int = _setting(8, "simulated GPU count (with simulate)")
    sim_model: str = _setting("H100", f"simulated GPU model: {', '.join(GPU_PROFILES)}")
    sim_scenario: str = _setting(
        "", "TOML file of faults to inject into the simulated GPUs (see collector/simnvml/scenario.py)"
    )
    sim_nvml_library: str = _setting(
        "",
        "with simulate: the C stand-in library to load beneath pynvml (a .so built by "
        "gpufleet.collector.simnvml.clibrary.build: real foreign calls, hangs blocked in C); empty: "
        "the Python stand-in",
    )
    sim_nvml_init_hang_s: float = _setting(
        0.0,
        "with simulate: the stand-in's nvmlInit does not return for this long (a driver that hangs at start)",
    )
    sim_nvml_real_load: bool = _setting(
        False,
        "with simulate: no stand-in beneath pynvml; pynvml loads libnvidia-ml.so.1 itself, by its own "
        "load path and lock (the tests' library whose load never returns: a driver stuck loading)",
    )
    workloads: bool = _setting(
        True,
        "name the workload of each GPU's processes (their cgroup or Slurm environment: "
        "docs/workloads.md); the aggregator reads owners from the scheduler",
    )
    kubelet_pod_resources_socket: str = _setting(
        "",
        "on Kubernetes: the kubelet's PodResources socket (/var/lib/kubelet/pod-resources/kubelet.sock, "
        "mounted read-only by deploy/kubernetes): which pod each GPU is allocated to, even with no "
        "process on it; empty: not read",
    )
    kubelet_gpu_resources: str = _setting(
        "nvidia.com/gpu", "the extended resource names whose devices are GPUs (comma-separated)"
    )
    sim_gpu_users_tag: str = _setting(
        "",
        "with simulate: the GPUs run exactly what real processes on this machine say they run: those "
        "with GPUFLEET_SIM_TAG = this tag, SLURMD_NODENAME or GPUFLEET_SIM_NODE = this node, "
        "GPUFLEET_SIM_UTIL_PCT, their GPUs in SLURM_JOB_GPUS or CUDA_VISIBLE_DEVICES; no simulated job "
        "of the node's own; empty: off",
    )
    sim_jobs_dir: str = _setting(
        "",
        "with simulate: the demo scheduler's folder; each simulated job is a user's job in an "
        "account, recorded there (what the aggregator's site scheduler reads) with a cgroup for its "
        "process in sim_jobs_dir/proc",
    )
    sim_scheduler_file: str = _setting(
        "",
        "with simulate: the file the demo's scheduler writes this node's state to (cordoned, drained; "
        "absent: in service): no job starts on a cordoned node, a drained node's job stops",
    )
    kmsg_path: str = _setting(
        "",
        "kernel log to read XIDs from; empty: /dev/kmsg on a real GPU node, none with simulate",
    )
    kmsg_boot_id_path: str = _setting(
        "/proc/sys/kernel/random/boot_id",
        "the kernel's boot id: with state_dir, what was reported from the kernel log is remembered "
        "per boot, and XIDs logged since the boot began and not yet reported are sent at start",
    )
    xid_storm_window_s: float = _setting(
        60.0,
        "identical XIDs (same GPU, same number) within this many seconds of the last are folded "
        "into one event with a count, sent at the next sampling tick; 0 sends every one",
    )
    metrics_listen: str = _setting(
        "127.0.0.1:9410",
        "Prometheus /metrics address (host:port; port 0 picks one; unauthenticated: loopback unless "
        "set, e.g. 0.0.0.0:9410 behind a NetworkPolicy or firewall); empty disables",
    )
    metrics_names: str = _setting(
        "gpufleet",
        "the names /metrics serves: gpufleet (gpufleet_gpu_*), dcgm (dcgm-exporter's DCGM_FI_* names, "
        "units and labels, so its dashboards and alert rules keep working; docs/prometheus-and-grafana.md "
        '"Coming from dcgm-exporter"), or both',
    )
    sim_engine: str = _setting(
        "",
        f"with simulate: serve and scrape a simulated inference engine ({' or '.join(SIMULATED_ENGINES)}) "
        "on this node",
    )
    engines: str = _setting(
        "",
        "inference-engine /metrics endpoints, ';'-separated, each 'URL [gpus=0,1] [pool=NAME]' "
        f"({', '.join(ENGINE_PARSERS)})",
    )
    engine_discovery: bool = _setting(
        True,
        "find engines from the GPUs' NVML process ids (needs the host PID namespace); off with simulate",
    )
    engine_timeout_s: float = _setting(2.0, "seconds an engine endpoint may take to answer a scrape")
    nvml_deadline_s: float = _setting(
        10.0,
        "seconds one NVML call may take before its GPU is reported driver_unresponsive (each GPU is "
        "sampled on a thread of its own: a hung call never holds the others or the sampling loop)",
    )
    pci_sysfs_dir: str = _setting(
        "/sys/bus/pci/devices",
        "where NVIDIA GPUs on the PCI bus are counted, to see one missing from the driver "
        "(empty: not counted)",
    )
    tls_ca: str = _setting(
        "",
        "PEM CA bundle: connect with TLS and verify the aggregator against it (needed for any "
        "aggregator address but loopback, unless allow_plaintext)",
    )
    tls_client_cert: str = _setting(
        "",
        "PEM client certificate whose CN or DNS name is this node (aggregator collector_auth = mtls): "
        "it proves the node instead of a token",
    )
    tls_client_key: str = _setting("", "PEM private key of tls_client_cert")
    allow_plaintext: bool = _setting(
        False,
        "connect to a non-loopback aggregator without TLS (the token and GPU-reset commands then cross "
        "the network in clear): only on a network you trust",
    )
    reset_command: str = _setting(
        "",
        "command run for a GPU reset the aggregator asks for, e.g. "
        "'nvidia-smi --gpu-reset -i {gpu_index}'; empty refuses resets (with --simulate: the "
        "simulated GPU is reset)",
    )
    reset_timeout_s: float = _setting(300.0, "seconds before a reset command is killed and reported failed")
    reset_socket: str = _setting(
        "",
        "Unix socket of the privileged GPU-reset helper (`gpufleet gpu-reset-helper`): resets go "
        "there, so this network-facing collector needs no CAP_SYS_ADMIN; wins over reset_command",
    )
    reset_min_interval_s: float = _setting(
        300.0, "a second reset of the same GPU within this many seconds is refused (a repeated command)"
    )
    backoff_max_s: float = _setting(30.0, "longest wait between reconnect attempts")
    ack_timeout_intervals: float = _setting(
        2.0,
        "with several aggregator addresses: move to the next one when the oldest report sent on "
        "the stream has waited this many intervals for its acknowledgement (a replica that hangs "
        "keeps its TCP connection open, which keepalive notices only after 30 s); 0 turns it off",
    )
    shutdown_grace_s: float = _setting(
        5.0,
        "on SIGTERM, seconds to wait for unacknowledged reports to be acknowledged",
    )
    state_dir: str = _setting(
        "",
        "where reports still unacknowledged at a stop are kept and sent again after the restart "
        "(empty: not kept; the shipped systemd unit and DaemonSet set it)",
    )

    def __post_init__(self) -> None:
        self._check_sampling()
        self._check_transport()
        if not 0 <= self.reset_min_interval_s <= 86400:
            raise ValueError(
                f"reset_min_interval_s={self.reset_min_interval_s:g} must be between 0 and 86400"
            )

    def _check_sampling(self) -> None:
        """What and how the collector samples: names, intervals, the simulation, engines."""
        problem = node_name_problem(self.node)
        if problem:
            raise ValueError(f"node name {self.node[:300]!r} is not usable: {problem}")
        problem = node_name_problem(self.cluster)
        if problem:
            raise ValueError(f"cluster name {self.cluster[:300]!r} is not usable: {problem}")
        if not 0.05 <= self.interval_s <= 3600:
            raise ValueError(f"interval_s={self.interval_s} must be between 0.05 and 3600 seconds")
        if self.metrics_names not in METRICS_NAMES:
            raise ValueError(
                f"metrics_names={self.metrics_names!r} must be one of {', '.join(METRICS_NAMES)}"
            )
        if not 0 <= self.xid_storm_window_s <= 86400:
            raise ValueError(
                f"xid_storm_window_s={self.xid_storm_window_s} must be between 0 and 86400 seconds"
            )
        if self.buffer_reports < 1:
            raise ValueError(f"buffer_reports={self.buffer_reports} must be at least 1")
        self._check_simulation()
        if not 0.1 <= self.engine_timeout_s <= 60:
            raise ValueError(f"engine_timeout_s={self.engine_timeout_s} must be between 0.1 and 60")
        if self.ack_timeout_intervals != 0 and not 1 <= self.ack_timeout_intervals <= 1000:
            raise ValueError(
                f"ack_timeout_intervals={self.ack_timeout_intervals:g} must be 0 (off) or between 1 and 1000"
            )
        if not 0.001 <= self.nvml_deadline_s <= 600:
            raise ValueError(f"nvml_deadline_s={self.nvml_deadline_s} must be between 0.001 and 600 seconds")
        parse_endpoints(self.engines)  # raises ValueError naming the bad entry

    def _check_simulation(self) -> None:
        if self.simulate and self.sim_model not in GPU_PROFILES:
            raise ValueError(
                f"sim_model={self.sim_model!r} is unknown; choose one of {', '.join(GPU_PROFILES)}"
            )
        if self.sim_nvml_library and not (self.simulate and os.path.isfile(self.sim_nvml_library)):
            raise ValueError(
                f"sim_nvml_library={self.sim_nvml_library!r}: give it with simulate, as the path of a "
                "built stand-in (python -c 'from gpufleet.collector.simnvml.clibrary import build; "
                "print(build(DIR))')"
            )
        if not 0 <= self.sim_gpus <= 64:
            raise ValueError(f"sim_gpus={self.sim_gpus} must be between 0 and 64")
        if self.sim_engine and self.sim_engine not in SIMULATED_ENGINES:
            raise ValueError(f"sim_engine={self.sim_engine!r} must be {' or '.join(SIMULATED_ENGINES)}")

    def _check_transport(self) -> None:
        """How the collector reaches the aggregator and proves its node: never in clear off loopback."""
        if self.secret_file and not self.allow_shared_secret:
            raise ValueError(
                "secret_file derives this node's credential from the fleet-wide collector secret, so "
                "any host holding it can report as every node; use token_file (a per-node token from "
                "`gpufleet auth collector-token NODE`, or the projected ServiceAccount token on "
                "Kubernetes), or set allow_shared_secret = true to accept that risk"
            )
        if not self.aggregator_addresses or any(":" not in a for a in self.aggregator_addresses):
            raise ValueError(f"aggregator={self.aggregator!r} must be host:port, or several comma-separated")
        if bool(self.tls_client_cert) != bool(self.tls_client_key):
            raise ValueError("tls_client_cert and tls_client_key must be given together")
        if self.tls_client_cert and not self.tls_ca:
            raise ValueError("tls_client_cert needs tls_ca: a client certificate is only sent over TLS")
        remote = [a for a in self.aggregator_addresses if not is_loopback(a.rpartition(":")[0])]
        if remote and not self.tls_ca and not self.allow_plaintext:
            raise ValueError(
                f"aggregator {remote[0]} is not on this machine and tls_ca is not set: the collector "
                "token and GPU-reset commands would cross the network in clear. Set tls_ca (see "
                "docs/security.md), or allow_plaintext = true on a network you trust"
            )

    @property
    def aggregator_addresses(self) -> list[str]:
        return [a.strip() for a in self.aggregator.split(",") if a.strip()]

    def resolve_token(self) -> str:
        if self.secret_file:
            # Derived again at every connect, valid for a day; all derived tokens share one id,
            # so revoking it cuts off every node that derives its own (docs/security.md).
            expires = int(time.time()) + 86400
            return collector_token(self._read("secret_file"), self.node, SHARED_SECRET_TOKEN_ID, expires)
        if self.token_file:
            return self._read("token_file")
        return self.token

    def _read(self, setting: str) -> str:
        path = getattr(self, setting)
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError as exc:
            raise ValueError(f"cannot read {setting} {path!r}: {exc}") from exc
