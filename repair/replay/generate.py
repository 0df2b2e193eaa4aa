"""Generated fault histories: the interruption mix of the Llama 3 paper's Table 5.

"The Llama 3 Herd of Models" (arXiv 2407.21783, section 3.3.4, Table 5): 419 unexpected
interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs (2,048 nodes of 8);
the counts per root cause are in llama3_table5.csv beside this file. `generate_llama3` draws
that many interruptions per cause (scaled to the fleet size and days asked for), at uniform
random times and on uniform random nodes and GPUs (seeded), each as the signals gpufleet would
see for that cause — our mapping, not the paper's, stated per cause in CAUSES below:

- a faulty GPU falls off the bus (XID 79, NVML answers GPU_IS_LOST) or reports an
  uncorrectable ECC error (XID 48, a volatile DBE); a faulty part keeps failing: the fault
  comes back every `recur_s` for `recur_for_s` (until it is replaced);
- HBM3: XID 48 with XID 63 and a row remap pending a reset (fixed by the reset); one in four
  cannot be remapped (remap failure: the GPU needs replacing);
- SRAM: XID 95 (uncontained ECC error); GPU System Processor: XID 119 (GSP RPC timeout);
- thermal interface: sustained thermal slowdown for six hours;
- software bugs in the training stack: the application's own XIDs (13 or 31), labeled
  application: the node is fine;
- host maintenance: the node's collector is silent for 20-60 minutes, labeled benign;
- power supply, chassis, CPU, system memory: the node goes down (collector silent) until
  repaired (four hours);
- network switches and cables, NICs, SSDs, IO boards, silent data corruption, NCCL watchdog
  timeouts and dependencies show nothing in GPU telemetry: faults gpufleet cannot see.

Labels: GPU and host parts hardware; NCCL timeouts and dependencies software; software bugs
application; host maintenance benign. Every labeled input carries its root cause (Table 5's
component), so the report counts caught and missed per cause.

With `hidden=True` (`gpufleet replay --generate llama3 --hidden-failures`), failures the driver
hides are added (docs/repair.md "Failures the driver hides"). Table 5 does not count them (its
causes are what the paper's team diagnosed after an interruption); the counts in HIDDEN are our
assumption for the paper's fleet and days, stated here and in docs/repair.md, scaled the same
way, and labeled hardware:

- driver call hangs: one GPU's NVML calls stop returning (driver_unresponsive) until a reboot;
- recovery action pending: NVML asks for a GPU reset (half) or a node reboot (half);
- PCIe link downtrained: Gen5 x16 trains to Gen5 x8 (width halved; the shipped rule alerts);
- NVLink fabric down: every GPU of the node reports its fabric not started, until a reboot;
- GPU missing from the driver: the PCI bus shows 8, NVML lists 7, until a reboot;
- corrected-ECC storm: one GPU at 5,000 corrected errors/s, its peers at none, until a reset;
- gray failure: on a node busy at 97 %, one GPU's SM clock and power 25 % below its peers' for
  a day (the shipped rule alerts)."""

from __future__ import annotations

import csv
import dataclasses
import importlib.resources
import random
from collections.abc import Callable

from gpufleet.repair.replay.history import NVML_GPU_COUNT, ON_PCI_BUS, REPORTING, FaultHistory, FaultInput

HOUR_S = 3600.0
PAPER_NODES, PAPER_DAYS = 2048, 54.0


def table5() -> list[tuple[str, str, int]]:
    """(component, category, count) rows of llama3_table5.csv."""
    text = (importlib.resources.files("gpufleet.repair.replay") / "llama3_table5.csv").read_text()
    rows = csv.reader(line for line in text.splitlines() if line and not line.startswith("#"))
    next(rows)  # header
    return [(component, category, int(count)) for component, category, count in rows]


Emit = Callable[[random.Random, str, int, float, float, float], list[FaultInput]]


def _ns(t_s: float) -> int:
    return int(t_s * 1e9)


def _xids(xids: tuple[int, ...], label: str, message: str) -> Emit:
    def emit(
        rng: random.Random, node: str, gpu: int, t: float, recur_s: float, recur_for_s: float
    ) -> list[FaultInput]:
        return [FaultInput(_ns(t), node, gpu, xid=x, label=label, message=message) for x in xids]

    return emit


def _faulty_gpu(
    rng: random.Random, node: str, gpu: int, t: float, recur_s: float, recur_for_s: float
) -> list[FaultInput]:
    out: list[FaultInput] = []
    fallen = rng.random() < 0.5
    k = 0.0
    while k <= recur_for_s:
        at, again = t + k, k > 0  # the first failure is the interruption; the rest recur
        if fallen:
            out.append(
                FaultInput(
                    _ns(at),
                    node,
                    gpu,
                    xid=79,
                    label="hardware",
                    message="GPU has fallen off the bus.",
                    recurrence=again,
                )
            )
            out.append(
                FaultInput(_ns(at) + 1, node, gpu, signal="lost", value=1, label="hardware", recurrence=again)
            )
        else:
            out.append(
                FaultInput(
                    _ns(at),
                    node,
                    gpu,
                    xid=48,
                    label="hardware",
                    message="An uncorrectable double bit error",
                    recurrence=again,
                )
            )
            out.append(
                FaultInput(
                    _ns(at) + 1,
                    node,
                    gpu,
                    signal="ecc_dbe_volatile",
                    value=1,
                    label="hardware",
                    recurrence=again,
                )
            )
        k += recur_s
    return out


def _hbm(
    rng: random.Random, node: str, gpu: int, t: float, recur_s: float, recur_for_s: float
) -> list[FaultInput]:
    out = [
        FaultInput(_ns(t), node, gpu, xid=48, label="hardware", message="An uncorrectable double bit error"),
        FaultInput(_ns(t) + 1, node, gpu, xid=63, label="hardware", message="Row remapping event"),
        FaultInput(_ns(t) + 2, node, gpu, signal="remap_pending", value=1, label="hardware"),
    ]
    if rng.random() < 0.25:
        out.append(FaultInput(_ns(t) + 3, node, gpu, signal="remap_failure", value=1, label="hardware"))
    return out


def _thermal(
    rng: random.Random, node: str, gpu: int, t: float, recur_s: float, recur_for_s: float
) -> list[FaultInput]:
    return [
        FaultInput(_ns(t), node, gpu, signal="throttle_thermal", value=1, label="hardware"),
        FaultInput(_ns(t + 6 * HOUR_S), node, gpu, signal="throttle_thermal", value=0),
    ]


def _node_down(label: str, low_s: float, high_s: float) -> Emit:
    def emit(
        rng: random.Random, node: str, gpu: int, t: float, recur_s: float, recur_for_s: float
    ) -> list[FaultInput]:
        return [
            FaultInput(_ns(t), node, None, signal=REPORTING, value=0, label=label),
            FaultInput(_ns(t + rng.uniform(low_s, high_s)), node, None, signal=REPORTING, value=1),
        ]

    return emit


def _app(
    rng: random.Random, node: str, gpu: int, t: float, recur_s: float, recur_for_s: float
) -> list[FaultInput]:
    xid = rng.choice((13, 31))
    return [
        FaultInput(_ns(t), node, gpu, xid=xid, label="application", message="the training job's own error")
    ]


def _unseen(label: str) -> Emit:
    def emit(
        rng: random.Random, node: str, gpu: int, t: float, recur_s: float, recur_for_s: float
    ) -> list[FaultInput]:
        return [FaultInput(_ns(t), node, None, label=label, message="no GPU signal")]

    return emit


CAUSES: dict[str, Emit] = {
    "Faulty GPU": _faulty_gpu,
    "GPU HBM3 Memory": _hbm,
    "Software Bug": _app,
    "Network Switch/Cable": _unseen("hardware"),
    "Host Maintenance": _node_down("benign", 20 * 60, 60 * 60),
    "GPU SRAM Memory": _xids((95,), "hardware", "Uncontained: SM ECC error"),
    "GPU System Processor": _xids(
        (119,), "hardware", "Timeout after 6s of waiting for RPC response from GPU0 GSP"
    ),
    "NIC": _unseen("hardware"),
    "NCCL Watchdog Timeouts": _unseen("software"),
    "Silent Data Corruption": _unseen("hardware"),
    "GPU Thermal Interface + Sensor": _thermal,
    "SSD": _unseen("hardware"),
    "Power Supply": _node_down("hardware", 4 * HOUR_S, 4 * HOUR_S),
    "Server Chassis": _node_down("hardware", 4 * HOUR_S, 4 * HOUR_S),
    "IO Expansion Board": _unseen("hardware"),
    "Dependency": _unseen("software"),
    "CPU": _node_down("hardware", 4 * HOUR_S, 4 * HOUR_S),
    "System Memory": _node_down("hardware", 4 * HOUR_S, 4 * HOUR_S),
}


def _gpu_signals(*signals: tuple[str, float], until_s: float = 0.0) -> Emit:
    """One GPU's signals set at once (labeled hardware); back to 0 after until_s if given."""

    def emit(
        rng: random.Random, node: str, gpu: int, t: float, recur_s: float, recur_for_s: float
    ) -> list[FaultInput]:
        out = [
            FaultInput(_ns(t) + k, node, gpu, signal=name, value=value, label="hardware")
            for k, (name, value) in enumerate(signals)
        ]
        if until_s:
            out += [FaultInput(_ns(t + until_s), node, gpu, signal=name, value=0) for name, _ in signals]
        return out

    return emit


def _recovery_action(
    rng: random.Random, node: str, gpu: int, t: float, recur_s: float, recur_for_s: float
) -> list[FaultInput]:
    action = rng.choice((1, 2))  # NVML_GPU_RECOVERY_ACTION_GPU_RESET, _NODE_REBOOT
    return [FaultInput(_ns(t), node, gpu, signal="recovery_action", value=action, label="hardware")]


def _pcie_downtrain(
    rng: random.Random, node: str, gpu: int, t: float, recur_s: float, recur_for_s: float
) -> list[FaultInput]:
    link = (
        ("pcie_link_gen_max", 5),
        ("pcie_link_width_max", 16),
        ("pcie_link_gen", 5),
        ("pcie_link_width", 8),
    )
    return [
        FaultInput(_ns(t) + k, node, gpu, signal=name, value=value, label="hardware")
        for k, (name, value) in enumerate(link)
    ]


def _fabric_down(gpus_per_node: int) -> Emit:
    def emit(
        rng: random.Random, node: str, gpu: int, t: float, recur_s: float, recur_for_s: float
    ) -> list[FaultInput]:
        # Every GPU shows it; the fault is counted once (its first GPU's input is the labeled one).
        return [
            FaultInput(
                _ns(t) + g, node, g, signal="fabric_state", value=1, label="hardware" if g == 0 else ""
            )
            for g in range(gpus_per_node)
        ]

    return emit


def _missing_from_driver(gpus_per_node: int) -> Emit:
    def emit(
        rng: random.Random, node: str, gpu: int, t: float, recur_s: float, recur_for_s: float
    ) -> list[FaultInput]:
        return [
            FaultInput(_ns(t), node, None, signal=ON_PCI_BUS, value=gpus_per_node, label="hardware"),
            FaultInput(
                _ns(t) + 1, node, None, signal=NVML_GPU_COUNT, value=gpus_per_node - 1, label="hardware"
            ),
        ]

    return emit


def _slow_gpu(gpus_per_node: int) -> Emit:
    def emit(
        rng: random.Random, node: str, gpu: int, t: float, recur_s: float, recur_for_s: float
    ) -> list[FaultInput]:
        out = []
        for g in range(gpus_per_node):
            factor, label = (0.75, "hardware") if g == gpu else (1.0, "")
            for k, (name, value) in enumerate(
                (("util_gpu_pct", 97.0), ("clock_sm_mhz", 1980.0 * factor), ("power_w", 650.0 * factor))
            ):
                out.append(FaultInput(_ns(t) + 3 * g + k, node, g, signal=name, value=value, label=label))
            out.append(FaultInput(_ns(t + 24 * HOUR_S) + g, node, g, signal="util_gpu_pct", value=0))
        return out

    return emit


def hidden_causes(gpus_per_node: int) -> dict[str, tuple[int, Emit]]:
    """Failures the driver hides: (count per the paper's 2,048 nodes x 54 days, our assumption;
    how it shows)."""
    return {
        "Driver call hangs": (12, _gpu_signals(("driver_unresponsive", 1))),
        "Recovery action pending": (10, _recovery_action),
        "PCIe link downtrained": (8, _pcie_downtrain),
        "NVLink fabric down": (4, _fabric_down(gpus_per_node)),
        "GPU missing from driver": (6, _missing_from_driver(gpus_per_node)),
        "Corrected-ECC storm": (8, _gpu_signals(("ecc_sbe_rate_per_s", 5000.0))),
        "Gray failure (slow GPU)": (6, _slow_gpu(gpus_per_node)),
    }


def generate_llama3(
    nodes: int = PAPER_NODES,
    days: float = PAPER_DAYS,
    seed: int = 0,
    gpus_per_node: int = 8,
    start_ns: int = 1_767_225_600 * 10**9,  # 2026-01-01T00:00:00Z: a fixed start, so a seed repeats
    recur_s: float = 6 * HOUR_S,
    recur_for_s: float = 12 * HOUR_S,
    hidden: bool = False,
) -> FaultHistory:
    """Table 5's interruptions, scaled by nodes x days against the paper's 2,048 nodes x 54
    days (a fractional count is drawn: 2.4 is 2 or 3), as a labeled history; with `hidden`,
    the failures the driver hides (HIDDEN, our assumed counts) as well."""
    if not 1 <= nodes <= 100_000:
        raise ValueError(f"--nodes {nodes}: give 1 to 100,000 nodes")
    if not 0 < days <= 3650:
        raise ValueError(f"--days {days}: give more than 0 and at most 3,650 days")
    if not 1 <= gpus_per_node <= 64:
        raise ValueError(f"--gpus-per-node {gpus_per_node}: give 1 to 64")
    rng = random.Random(seed)
    scale = nodes * days / (PAPER_NODES * PAPER_DAYS)
    names = [f"n{k:04d}" for k in range(1, nodes + 1)]
    span_s = days * 86400.0
    inputs: list[FaultInput] = []
    mix: list[tuple[str, int, Emit]] = []
    for component, _category, count in table5():
        emit = CAUSES.get(component)
        if emit is None:
            raise ValueError(f"llama3_table5.csv: no signal mapping for {component!r} in CAUSES")
        mix.append((component, count, emit))
    if hidden:
        mix += [(cause, count, emit) for cause, (count, emit) in hidden_causes(gpus_per_node).items()]
    for cause, count, emit in mix:
        expected = count * scale
        n = int(expected) + (rng.random() < expected - int(expected))
        for _ in range(n):
            t = start_ns / 1e9 + rng.uniform(0, span_s)
            drawn = emit(rng, rng.choice(names), rng.randrange(gpus_per_node), t, recur_s, recur_for_s)
            inputs += [dataclasses.replace(i, cause=cause) if i.label else i for i in drawn]
    end_ns = start_ns + _ns(span_s)
    inputs = [i for i in inputs if i.time_ns <= end_ns]
    history = FaultHistory.of(
        inputs, f"generated llama3 Table 5 mix, seed {seed}", nodes, gpus_per_node, start_ns, end_ns
    )
    history.nodes = names
    return history
