"""What a scrape of the collector's DCGM face costs against its native face (issue 56).

    python bench/dcgm_face_bench.py                  # 8 GPUs, 2,000 scrapes a round, 7 rounds
    python bench/dcgm_face_bench.py --gpus 16 --scrapes 5000

One collector's /metrics body rendered from the same report by each face's registry
(collector/metrics_endpoint.py registry_of: "gpufleet", "dcgm", "both"), in this process, the
faces taking turns round by round: CPU time (process_time) per scrape, and bytes per scrape. The
report is a simulated node's (collector/simnvml), sampled through gpufleet's own NVML reader,
with a Kubernetes pod on half its GPUs (the DCGM face's pod labels). Prints the median of the
rounds for each face and the DCGM face's ratio to the native one: the target is at most 1.2.
"""

from __future__ import annotations

import argparse
import statistics
import time

from prometheus_client import generate_latest

from gpufleet.collector.metrics_endpoint import registry_of
from gpufleet.collector.simnvml import SimulatedNode, SimulatedNvmlLibrary, install
from gpufleet.collector.sources.nvml import NvmlSource
from gpufleet.protos import telemetry_pb2

FACES = ("gpufleet", "dcgm", "both")


def a_report(gpus: int) -> telemetry_pb2.NodeReport:
    node = SimulatedNode("bench-node", gpus, "H100", seed=7)
    install(SimulatedNvmlLibrary(node))
    source = NvmlSource()
    samples = source.sample()
    half = list(range(gpus // 2))
    pod = telemetry_pb2.WorkloadSample(
        scheduler="kubernetes", id="ml/train-0", part="trainer", gpu_indices=half
    )
    return telemetry_pb2.NodeReport(node="bench-node", cluster="bench", gpus=samples, workloads=[pod])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scrapes", type=int, default=2000, help="scrapes per face per round")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    report = a_report(args.gpus)
    registries = {
        face: registry_of(
            face, lambda: report, xid_last=lambda: {"1": 79}, driver_version=lambda: "570.133.20"
        )
        for face in FACES
    }
    per_scrape: dict[str, list[float]] = {face: [] for face in FACES}
    size = {face: len(generate_latest(r)) for face, r in registries.items()}
    for round_ in range(args.rounds):
        for face in FACES if round_ % 2 == 0 else reversed(FACES):
            registry = registries[face]
            start = time.process_time()
            for _ in range(args.scrapes):
                generate_latest(registry)
            per_scrape[face].append((time.process_time() - start) / args.scrapes)
    median = {face: statistics.median(v) for face, v in per_scrape.items()}
    print(f"{args.gpus} GPUs, {args.scrapes} scrapes a round, {args.rounds} rounds (medians):")
    for face in FACES:
        print(
            f"  {face:9s} {median[face] * 1e6:8.0f} µs CPU per scrape, {size[face]:7,} bytes, "
            f"{len(report.gpus)} GPUs"
        )
    print(
        f"DCGM face / native face, CPU per scrape: {median['dcgm'] / median['gpufleet']:.2f} (target ≤ 1.2)"
    )
    print(f"both / native: {median['both'] / median['gpufleet']:.2f}")


if __name__ == "__main__":
    main()
