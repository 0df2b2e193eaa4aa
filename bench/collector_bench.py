"""Collector cost: CPU per report and memory, next to bare pynvml making the same calls.

    python bench/collector_bench.py                 # simulated GPUs (stand-in NVML), 8 GPUs
    python bench/collector_bench.py --real          # the real driver (on a GPU machine)

Two measurements in one run:
1. In-process, CPU time (process_time) per sample of all GPUs: gpufleet's NvmlSource +
   building and serialising the report, against a baseline of bare pynvml calls — the same
   NVML calls with none of our code. Ratio = our cost over NVML's.
2. A real collector process (`gpufleet collector run`, 1 s interval) streaming to the bare
   gRPC server (bench/bare_server.py) for --seconds: its CPU % of one core and peak RSS, read
   with psutil — what a GPU node pays.
With the stand-in, "NVML" is our Python stand-in, so the baseline is slower than a real
driver and the ratio understates our share; run with --real on a GPU node for that.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pynvml
from ingest_bench import wait_for_file  # bench/ is on sys.path when a bench script runs

from gpufleet.collector.simnvml import SimulatedNode, SimulatedNvmlLibrary, install
from gpufleet.collector.sources.nvml import NvmlSource
from gpufleet.protos import telemetry_pb2

HERE = Path(__file__).resolve().parent


# The fields gpufleet reads in one call per GPU (HBM temperature, NVLink error totals).
FIELD_IDS = [
    pynvml.NVML_FI_DEV_MEMORY_TEMP,
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
]


def bare_pynvml_sample(handles: list[object]) -> None:
    """The NVML calls gpufleet makes per sample, with nothing of ours around them."""
    for h in handles:
        for fn, args in (
            (pynvml.nvmlDeviceGetUtilizationRates, ()),
            (pynvml.nvmlDeviceGetMemoryInfo, ()),
            (pynvml.nvmlDeviceGetTemperature, (0,)),
            (pynvml.nvmlDeviceGetPowerUsage, ()),
            (pynvml.nvmlDeviceGetEnforcedPowerLimit, ()),
            (pynvml.nvmlDeviceGetClockInfo, (1,)),
            (pynvml.nvmlDeviceGetClockInfo, (2,)),
            (pynvml.nvmlDeviceGetCurrentClocksEventReasons, ()),
            (pynvml.nvmlDeviceGetTotalEccErrors, (0, 0)),
            (pynvml.nvmlDeviceGetTotalEccErrors, (1, 0)),
            (pynvml.nvmlDeviceGetTotalEccErrors, (0, 1)),
            (pynvml.nvmlDeviceGetTotalEccErrors, (1, 1)),
            (pynvml.nvmlDeviceGetRemappedRows, ()),
            (pynvml.nvmlDeviceGetPcieReplayCounter, ()),
            (pynvml.nvmlDeviceGetComputeRunningProcesses, ()),
        ):
            with contextlib.suppress(pynvml.NVMLError):
                fn(h, *args)
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlDeviceGetFieldValues(h, FIELD_IDS)
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                pynvml.nvmlDeviceGetNvLinkState(h, link)
            except pynvml.NVMLError:
                break


def cpu_ms_per_call(fn: object, repeat: int) -> float:
    """Median over 5 rounds of CPU milliseconds per call."""
    rounds = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(repeat):
            fn()  # type: ignore[operator]
        rounds.append((time.process_time() - t0) * 1000 / repeat)
    return statistics.median(rounds)


def in_process(args: argparse.Namespace) -> dict[str, float]:
    if not args.real:
        install(SimulatedNvmlLibrary(SimulatedNode("bench-node", args.gpus, "H100", seed=1)))
    source = NvmlSource()
    handles = [g.handle for g in source.gpus]

    def ours() -> None:
        report = telemetry_pb2.NodeReport(
            node="bench-node", seq=1, time_unix_ns=time.time_ns(), gpus=source.sample()
        )
        report.SerializeToString()

    ours()  # warm up: NVLink discovery, function-pointer cache
    bare = cpu_ms_per_call(lambda: bare_pynvml_sample(handles), args.repeat)
    mine = cpu_ms_per_call(ours, args.repeat)
    source.close()
    return {"gpus": len(handles), "bare_pynvml_ms": bare, "gpufleet_ms": mine}


def process_run(args: argparse.Namespace) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-collector-bench-"))
    ready = tmp / "ready.json"
    server = subprocess.Popen([sys.executable, str(HERE / "bare_server.py"), "--ready-file", str(ready)])
    try:
        address = wait_for_file(ready, server, 30)["ingest"]
        argv = [
            sys.executable,
            "-m",
            "gpufleet.cli.main",
            "--log-level",
            "warning",
            "collector",
            "run",
            "--node",
            "bench-node",
            "--aggregator",
            address,
            "--interval-s",
            "1",
            "--metrics-listen",
            "",
        ]
        if not args.real:
            argv += ["--simulate", "--sim-gpus", str(args.gpus)]
        collector = subprocess.Popen(argv, env={**os.environ, "GPUFLEET_COLLECTOR_TOKEN": "bench"})
        proc = psutil.Process(collector.pid)
        time.sleep(args.warmup)  # start-up (imports, NVML init) is not the steady state
        t0, c0 = time.monotonic(), sum(proc.cpu_times()[:2])
        peak = 0
        while time.monotonic() - t0 < args.seconds:
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.25)
        cpu_pct = 100 * (sum(proc.cpu_times()[:2]) - c0) / (time.monotonic() - t0)
        collector.terminate()
        collector.wait(timeout=30)
        return {"cpu_pct_of_core_at_1s": cpu_pct, "peak_rss_mib": peak / 2**20}
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--real", action="store_true", help="use the real NVIDIA driver, not the stand-in")
    p.add_argument("--gpus", type=int, default=8, help="simulated GPUs (ignored with --real)")
    p.add_argument("--repeat", type=int, default=50, help="samples per round for the CPU-per-report figures")
    p.add_argument("--seconds", type=float, default=20.0, help="how long to watch the collector process")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    figures = {**in_process(args), **process_run(args)}
    nvml = "real NVML" if args.real else "stand-in NVML"
    print(f"collector benchmark, {figures['gpus']} GPUs, {nvml}, {os.cpu_count()} CPUs")
    print(
        f"  CPU per sample of all GPUs: gpufleet {figures['gpufleet_ms']:.2f} ms, bare pynvml "
        f"{figures['bare_pynvml_ms']:.2f} ms, ratio {figures['gpufleet_ms'] / figures['bare_pynvml_ms']:.2f}"
    )
    print(
        f"  collector process at a 1 s interval: {figures['cpu_pct_of_core_at_1s']:.2f} % of one core, "
        f"peak RSS {figures['peak_rss_mib']:.0f} MiB (targets: < 1 %, < 80 MB)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
