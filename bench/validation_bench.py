"""Cost of checking a report against every wire rule and converting it to points, next to the
cost of decoding it (what gRPC pays for every report anyway), in one process and one run, for
both layouts of its GPU samples: per GPU (`NodeReport.gpus`) and as columns (`gpu_columns`).

    python bench/validation_bench.py                # 8 GPUs, every field NVML gives set
    python bench/validation_bench.py --gpus 8 --runs 7

A report of `--gpus` GPUs with every GpuSample measurement set (the worst case: an absent field
costs nothing), a process per GPU, one engine and the collector's stats. Prints, per layout, the
median µs per report over --runs runs of --n reports each for: decoding the report's bytes (the
baseline), the ingest checks plus point conversion (`Checker.check_report`,
aggregator/ingest/validation.py and columns.py), and their ratio; then columns against per GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time

from loadgen import machine  # bench/ is on sys.path when a bench script runs

from gpufleet.aggregator.ingest.validation import Checker
from gpufleet.protos import columns, ingest_pb2, telemetry_pb2


def full_report(gpus: int) -> tuple[telemetry_pb2.NodeReport, ingest_pb2.Hello]:
    now = time.time_ns()
    hello = ingest_pb2.Hello(
        protocol_version=1,
        node="bench-node",
        cluster="bench",
        boot_id="b",
        interval_s=1.0,
        columnar_gpus=True,
    )
    report = telemetry_pb2.NodeReport(
        node="bench-node", cluster="bench", boot_id="b", seq=7, time_unix_ns=now, interval_s=1.0
    )
    for i in range(gpus):
        hello.gpus.add(index=i, uuid=f"GPU-{i:08x}-0000", model="NVIDIA H100 80GB HBM3")
        report.gpus.add(
            index=i,
            uuid=f"GPU-{i:08x}-0000",
            model="NVIDIA H100 80GB HBM3",
            pci_bus_id=f"00000000:{i + 0x18:02X}:00.0",
            util_gpu_pct=87.0,
            util_mem_pct=42.5,
            hbm_used_bytes=60 << 30,
            hbm_total_bytes=80 << 30,
            temp_gpu_c=61.0,
            temp_mem_c=70.0,
            power_w=512.3,
            power_limit_w=700.0,
            clock_sm_mhz=1980.0,
            clock_mem_mhz=2619.0,
            clock_event_reasons=0,
            throttle_thermal=False,
            throttle_power=False,
            ecc_sbe_volatile=3,
            ecc_dbe_volatile=0,
            ecc_sbe_aggregate=40,
            ecc_dbe_aggregate=0,
            retired_pages_sbe=0,
            retired_pages_dbe=0,
            retired_pages_pending=False,
            remap_correctable=1,
            remap_uncorrectable=0,
            remap_pending=False,
            remap_failure=False,
            pcie_replay_total=12,
            nvlink_links_active=18,
            nvlink_links_inactive=0,
            nvlink_replay_total=0,
            nvlink_recovery_total=0,
            nvlink_crc_total=0,
            process_count=1,
            recovery_action=0,
            pcie_link_gen=5,
            pcie_link_gen_max=5,
            pcie_link_width=16,
            pcie_link_width_max=16,
            fabric_state=3,
            fabric_status=0,
            ecc_sbe_rate_per_s=0.0,
        ).processes.add(pid=4242, used_memory_bytes=58 << 30)
    report.engines.add(
        engine="vllm", model="llama-3-70b", port=8000, gpu_indices=list(range(gpus)), readable=True,
        kv_cache_usage_ratio=0.8, requests_running=12, requests_waiting=3, preemptions_total=1,
        prefix_cache_hit_ratio=0.4,
    )  # fmt: skip
    report.stats.sample_duration_s = 0.012
    report.stats.reconnects_total = 1
    return report, hello


def per_report_us(fn: object, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()  # type: ignore[operator]
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--n", type=int, default=2000, help="reports per run")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    report, hello = full_report(args.gpus)
    columnar = telemetry_pb2.NodeReport()
    columnar.CopyFrom(report)
    columnar.ClearField("gpus")
    columnar.gpu_columns.CopyFrom(columns.to_columns(report.gpus))
    print(f"machine: {machine()}")
    costs = {}
    for layout, r in (("per GPU", report), ("columns", columnar)):
        data = r.SerializeToString()
        checker = Checker(1 << 20, 14 * 86400, 300)
        points = checker.check_report(r, hello)  # warm: tag cache, compiled rules, layout plan
        decode = [
            per_report_us(lambda data=data: telemetry_pb2.NodeReport.FromString(data), args.n)
            for _ in range(args.runs)
        ]
        check = [
            per_report_us(lambda r=r, checker=checker: checker.check_report(r, hello), args.n)
            for _ in range(args.runs)
        ]
        d, c = statistics.median(decode), statistics.median(check)
        costs[layout] = c
        print(f"{layout}: {args.gpus} GPUs, every field set, {len(data)} bytes, {len(points)} points")
        print(
            f"  decode (baseline)      {d:8.1f} µs per report  "
            f"(runs: {', '.join(f'{x:.1f}' for x in decode)})"
        )
        print(
            f"  check + convert        {c:8.1f} µs per report  (runs: {', '.join(f'{x:.0f}' for x in check)})"
        )
        print(
            f"  ratio check+convert / decode: {c / d:.1f}x; "
            f"at 2,000 reports/s: {c * 2000 / 1e4:.0f} % of one core"
        )
    print(f"columns / per GPU, check + convert: {costs['columns'] / costs['per GPU']:.2f}x")


if __name__ == "__main__":
    main()
