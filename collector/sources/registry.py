"""The collector's event sources, registered by name (common/registry.py): what pushes an event
(an XID) the moment it is seen, rather than at the next sampling tick. One interface: a start
function that, given the collector's settings, its NVML source and the push callback, returns the
started source, or None when it does not apply on this node (and says why in the log). A new
source is a module with its watcher and a line in EVENT_SOURCES; the sampled fields are the NVML source's
(collector/sources/nvml.py), the inference engines the engine parsers' (sources/engines/)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpufleet.collector.config import CollectorConfig
from gpufleet.collector.kmsg_cursor import KmsgCursor, cursor_path, read_boot_id
from gpufleet.collector.sources.nvml import NvmlSource
from gpufleet.collector.sources.xid_kmsg import KernelLogXidWatcher
from gpufleet.collector.sources.xid_nvml import NvmlXidWatcher
from gpufleet.common.registry import Registry
from gpufleet.protos import telemetry_pb2

log = logging.getLogger("gpufleet.collector")


class EventSource(Protocol):
    def stop(self) -> None: ...


@dataclass(frozen=True)
class SourceContext:
    config: CollectorConfig
    nvml: NvmlSource
    push: Callable[[telemetry_pb2.Event], None]  # called from the source's own thread


def nvml_xids(ctx: SourceContext) -> EventSource | None:
    """NVML's XID event set (nvmlEventSetWait), on every node whose NVML lists GPUs (none while
    NVML's start has not answered: collector/sources/nvml_start.py)."""
    if not ctx.nvml.gpus:
        return None
    watcher = NvmlXidWatcher(ctx.nvml, ctx.push)
    watcher.start()
    return watcher


def kernel_log(ctx: SourceContext) -> EventSource | None:
    """The kernel log's XID lines (/dev/kmsg): on a real node, or where a path is given (tests
    feed a FIFO); the host's kernel log says nothing about simulated GPUs."""
    config = ctx.config
    path = config.kmsg_path or ("" if config.simulate else "/dev/kmsg")
    if not path:
        return None
    cursor = None
    if config.state_dir:
        cursor = KmsgCursor(
            cursor_path(config.state_dir, config.node), read_boot_id(config.kmsg_boot_id_path)
        )
    else:
        log.warning(
            "no state_dir: the kernel log is read from its end, so XIDs logged while the "
            "collector was down are not reported; set state_dir to catch up on them"
        )
    watcher = KernelLogXidWatcher(path, ctx.nvml, ctx.push, cursor)
    return watcher if watcher.start() else None


@dataclass(frozen=True)
class EventSourceKind:
    name: str
    help: str
    start: Callable[[SourceContext], EventSource | None]


EVENT_SOURCES: Registry[EventSourceKind] = Registry(
    "event source",
    (
        EventSourceKind("nvml_xid", "NVML's XID event set", nvml_xids),
        EventSourceKind("kmsg", "the kernel log's XID lines, caught up after a restart", kernel_log),
    ),
)
