"""Find the inference engines on this node from the GPUs' own process lists.

NVML lists the PIDs computing on each GPU (host PIDs: in a container the collector needs the
host PID namespace). An engine's GPU workers (vLLM's `VLLM::Worker_TP<n>`, SGLang's
`sglang::scheduler_TP<n>`) are children of the process that serves its HTTP API, so for each
PID we walk up the process tree to the first process listening on TCP, try its ports for a
/metrics that a known engine parser recognises, and group the GPUs by that server: the
tensor-parallel size is the number of GPUs found. Results are cached; the scan runs again
when the GPU PIDs change or every `rescan_s`.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

import psutil
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.collector.sources.engines import REGISTRY
from gpufleet.collector.sources.engines.scrape import Endpoint, Unreadable, fetch
from gpufleet.protos import telemetry_pb2

log = logging.getLogger("gpufleet.collector.engines")

MAX_PORTS_TRIED = 5


class EngineDiscovery:
    def __init__(self, timeout_s: float = 1.0, rescan_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.rescan_s = rescan_s
        self._pids: frozenset[tuple[int, int]] = frozenset()
        self._scanned_at = 0.0
        self._found: list[Endpoint] = []
        self._url_of: dict[tuple[int, tuple[int, ...]], str | None] = {}

    def endpoints(self, gpus: list[telemetry_pb2.GpuSample]) -> list[Endpoint]:
        pids = frozenset((g.index, p.pid) for g in gpus for p in g.processes)
        if pids == self._pids and time.monotonic() - self._scanned_at < self.rescan_s:
            return self._found
        self._pids, self._scanned_at = pids, time.monotonic()
        servers: dict[tuple[int, tuple[int, ...]], set[int]] = defaultdict(set)
        for gpu_index, pid in pids:
            server = _listening_ancestor(pid)
            if server is not None:
                servers[server].add(gpu_index)
        found = []
        for server, gpu_indices in servers.items():
            if server not in self._url_of:
                self._url_of[server] = self._metrics_url(server[1])
            url = self._url_of[server]
            if url:
                found.append(Endpoint(url, tuple(sorted(gpu_indices))))
        if found != self._found:
            log.info(
                "engines found from GPU processes: %s",
                ", ".join(f"{e.url} (GPUs {','.join(map(str, e.gpus))})" for e in found) or "none",
            )
        self._found = found
        return found

    def _metrics_url(self, ports: tuple[int, ...]) -> str | None:
        for port in ports[:MAX_PORTS_TRIED]:
            url = f"http://127.0.0.1:{port}/metrics"
            try:
                text = fetch(url, self.timeout_s)
                names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
            except (Unreadable, ValueError, IndexError, TypeError):
                continue
            if any(parser.matches(names) for parser in REGISTRY.values()):
                return url
        return None


def _listening_ancestor(pid: int) -> tuple[int, tuple[int, ...]] | None:
    """(pid, listening TCP ports) of the process or its nearest ancestor that listens."""
    try:
        process = psutil.Process(pid)
        chain = [process, *process.parents()]
    except psutil.Error:
        return None  # gone, or not visible (no host PID namespace)
    for p in chain:
        if p.pid == 1:
            break
        try:
            ports = sorted(
                {c.laddr.port for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
            )
        except psutil.Error:
            continue
        if ports:
            return p.pid, tuple(ports)
    return None
