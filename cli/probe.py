"""`gpufleet collector probe`: one sample of this node, like `nvidia-smi -q` but in
gpufleet's schema — what the collector would send, read through the same code."""

from __future__ import annotations

import argparse
import json

from gpufleet.client.present import NA, message_fields
from gpufleet.collector.config import CollectorConfig
from gpufleet.collector.main import open_source
from gpufleet.protos import telemetry_pb2

GIB = 1024**3


def run_probe(args: argparse.Namespace, config: CollectorConfig) -> int:
    source, _, _ = open_source(config)
    try:
        samples = source.sample()
    finally:
        source.close()
    gpus = []
    for sample in samples:
        row = message_fields(sample)
        row["processes"] = [message_fields(p) for p in sample.processes]
        gpus.append(row)
    if args.json:
        print(
            json.dumps(
                {
                    "node": config.node,
                    "driver_version": source.driver_version,
                    "simulated": config.simulate,
                    "nvml_errors": source.errors_total,
                    "gpus": gpus,
                },
                indent=2,
            )
        )
        return 0
    print(
        f"node {config.node}: {len(gpus)} GPU(s), driver {source.driver_version}"
        f"{' (simulated)' if config.simulate else ''}, {source.errors_total} NVML error(s)"
    )
    for row in gpus:
        print(
            f"\nGPU {row['index']}  {row['model']}  {row['uuid']}  {row['pci_bus_id']}"
            f"{'  LOST' if row['lost'] else ''}"
        )
        for name, value in row.items():
            if name in ("index", "model", "uuid", "pci_bus_id", "lost", "processes"):
                continue
            shown = f"{value / GIB:.1f} GiB" if name.endswith("_bytes") else value
            print(f"  {name:24s} {shown}")
        if row["processes"]:
            print(
                "  processes                "
                + ", ".join(
                    f"pid {p['pid']} ({p.get('used_memory_bytes', 0) / GIB:.1f} GiB)"
                    for p in row["processes"]
                )
            )
        absent = [f for f in _ALL_FIELDS if f not in row]
        print(f"  not reported             {', '.join(absent) if absent else NA}")
    return 0


_ALL_FIELDS = [
    f.name for f in telemetry_pb2.GpuSample.DESCRIPTOR.fields if f.has_presence and f.type != f.TYPE_MESSAGE
]
