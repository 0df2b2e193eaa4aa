"""A fault history: what a replay feeds the controller (docs/architecture.md "Policy replay").

One list of timed inputs, each an XID event or a sampled health signal's new value on one
node (and GPU), optionally labeled with what the fault really was. Built from a trace file
(`load_trace`), a generator (repair/replay/generate.py) or the store's own history (the
aggregator's replay_source.py).

Trace file: JSON lines, one input each, `#` comment lines and blank lines allowed:
    {"time": "2026-03-01T10:00:00Z" | <unix seconds>, "node": "n0001", "gpu": 3, "xid": 79,
     "label": "hardware"}
or with `"signal": "<GpuSample field, as `gpufleet metrics` names it>", "value": <number>`
instead of "xid". A GPU signal keeps its value until the next input for it (as a sampled
field does). `label` (optional): hardware | software | application | benign. An input with
a label and neither xid nor signal is a fault gpufleet cannot see (a NIC, a switch, silent
data corruption): counted as missed, never fed to the controller. `cause` (optional, up to 64
characters): what the fault was (a root cause, a fault kind), so the report counts caught and
missed per cause; `recurrence` (optional, true or false): the same fault back again (a faulty
part failing again), counted apart from new interruptions. Node signals (no GPU):
`collector_reporting` (0 or 1) says whether the node's collector is reporting;
`gpus_on_pci_bus` the NVIDIA GPUs its PCI bus shows and `gpu_count` the GPUs NVML lists (fewer
than on the bus: a GPU missing from the driver).

Engine signals (the serving pools' readings, docs/repair.md "Serving-aware repair"): `"model":
"<served model>"` with `"signal": "kv_cache_usage_ratio" | "requests_running" |
"requests_waiting"` (no GPU): the node serves one replica of that model, and the value is what
that replica carries **with its whole pool serving** (its share of the pool's demand). The
replay spreads each pool's demand over the replicas it leaves serving (docs/repair.md "Policy
replay"), so the capacity guard sees the pressure rise when a replica leaves, as a router would
make it."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gpufleet.protos import telemetry_pb2
from gpufleet.protos.credentials import node_name_problem

LABELS = ("hardware", "software", "application", "benign")
ACTIONABLE = frozenset({"hardware", "software"})  # what automatic repair should take out
REPORTING = "collector_reporting"
ON_PCI_BUS = "gpus_on_pci_bus"
NVML_GPU_COUNT = "gpu_count"
NODE_SIGNALS = (REPORTING, ON_PCI_BUS, NVML_GPU_COUNT)
KV_CACHE = "kv_cache_usage_ratio"
ENGINE_SIGNALS = (KV_CACHE, "requests_running", "requests_waiting")
MAX_MODEL_CHARS = 253  # as long as the wire lets an engine name its model (aggregator/ingest/wire_rules.py)
# A signal is a number: text fields (identity, the name of a stuck NVML call) are not signals.
_GPU_FIELDS = {
    f.name: f
    for f in telemetry_pb2.GpuSample.DESCRIPTOR.fields
    if f.type not in (f.TYPE_MESSAGE, f.TYPE_STRING, f.TYPE_BYTES) and f.name != "index"
}
SIGNALS = (*sorted(_GPU_FIELDS), *NODE_SIGNALS, *ENGINE_SIGNALS)
MAX_CAUSE_CHARS = 64
MAX_GPUS = 64
MAX_INPUTS = 5_000_000


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file, line and value."""


@dataclass(frozen=True)
class FaultInput:
    time_ns: int
    node: str
    gpu: int | None = None
    xid: int = 0  # an XID event (0: not an XID)
    signal: str = ""  # or a sampled signal's new value
    value: float = 0.0
    label: str = ""
    message: str = ""
    count: int = 1  # a folded storm: this many identical XIDs (the collector's count)
    kind: int = 0  # vocabulary_pb2.EventKind for a recorded non-XID event (the store's history)
    source: int = 0  # vocabulary_pb2.EventSource of a recorded event
    cause: str = ""  # what the fault was, when known (a trace's "cause", a generated root cause)
    # The same fault back again (a faulty part failing again), not a new interruption: the report
    # counts interruptions and recurrences apart.
    recurrence: bool = False
    model: str = ""  # an engine signal's served model (the replica's pool)

    @property
    def visible(self) -> bool:
        return bool(self.xid or self.signal or self.kind)

    @property
    def codes(self) -> frozenset[str]:
        """The finding codes this input can cause (how a cordon is traced back to it)."""
        if self.xid:
            return frozenset({f"xid_{self.xid}"})
        return SIGNAL_CODES.get(self.signal, frozenset())


def _signal_codes() -> dict[str, frozenset[str]]:
    from gpufleet.repair.rules import RULES

    codes: dict[str, set[str]] = {}
    for name, factory in RULES.items():
        for f in (
            *getattr(factory, "watch_fields", ()),
            *getattr(factory, "context_fields", ()),
            *getattr(factory, "peer_fields", ()),
        ):
            codes.setdefault(f, set()).add(name)
    codes.setdefault("lost", set()).update({"gpu_lost", "gpu_missing"})
    codes.setdefault(REPORTING, set()).add("collector_silent")
    return {k: frozenset(v) for k, v in codes.items()}


SIGNAL_CODES = _signal_codes()


@dataclass
class FaultHistory:
    inputs: list[FaultInput]  # oldest first
    nodes: list[str]  # the whole fleet: every node the inputs name, and more
    gpus_per_node: int
    start_ns: int
    end_ns: int
    source: str  # what it was made from, for the report
    gpus_by_node: dict[str, int] = field(default_factory=dict)  # a node's own GPU count, when known

    def gpu_count(self, node: str) -> int:
        return self.gpus_by_node.get(node, self.gpus_per_node)

    @classmethod
    def of(
        cls,
        inputs: Iterable[FaultInput],
        source: str,
        nodes: int = 0,
        gpus_per_node: int = 8,
        start_ns: int | None = None,
        end_ns: int | None = None,
    ) -> FaultHistory:
        """A history over the inputs, with the fleet padded to `nodes` nodes (named n0001, ...,
        beyond those the inputs name) and the time range widened to the inputs'."""
        ordered = sorted(inputs, key=lambda i: i.time_ns)
        named = list(dict.fromkeys(i.node for i in ordered))
        extra = (f"n{k:04d}" for k in range(1, 10**6))
        fleet = list(named)
        known = set(named)
        while len(fleet) < nodes:
            name = next(extra)
            if name not in known:
                fleet.append(name)
                known.add(name)
        top = max((i.gpu for i in ordered if i.gpu is not None), default=-1)
        if top >= gpus_per_node:
            gpus_per_node = top + 1
        first = ordered[0].time_ns if ordered else 0
        last = ordered[-1].time_ns if ordered else 0
        start = first if start_ns is None else min(start_ns, first or start_ns)
        end = last if end_ns is None else max(end_ns, last)
        return cls(ordered, fleet, gpus_per_node, start, end, source)


def _time_ns(raw: object, where: str) -> int:
    if isinstance(raw, bool):
        raise TraceError(f'{where}: "time" = {raw!r}; give ISO 8601 (2026-03-01T10:00:00Z) or unix seconds')
    if isinstance(raw, int | float):
        if not math.isfinite(raw) or not 0 <= raw < 2**62 / 1e9:
            raise TraceError(f'{where}: "time" = {raw!r} is not a usable unix time in seconds')
        return int(raw * 1e9)
    if isinstance(raw, str):
        try:
            parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            raise TraceError(f'{where}: "time" = {raw!r} is not ISO 8601 (2026-03-01T10:00:00Z)') from None
        if parsed.tzinfo is None:
            raise TraceError(f'{where}: "time" = {raw!r} has no time zone; add Z for UTC')
        return int(parsed.timestamp() * 1e9)
    raise TraceError(f'{where}: "time" is missing or {raw!r}; give ISO 8601 or unix seconds')


TRACE_KEYS = {  # every key a trace line may have (docs/repair.md's trace format)
    "time",
    "node",
    "gpu",
    "xid",
    "signal",
    "value",
    "label",
    "message",
    "count",
    "cause",
    "recurrence",
    "model",
}


def parse_input(obj: object, where: str) -> FaultInput:
    """One trace line's object as an input; TraceError names what is wrong with it."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: each line must be a JSON object, not {type(obj).__name__}")
    unknown = set(obj) - TRACE_KEYS
    if unknown:
        raise TraceError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(TRACE_KEYS))}"
        )
    node, gpu, label, message, count = _common(obj, where)
    xid, signal = obj.get("xid"), obj.get("signal")
    if xid is not None and signal is not None:
        raise TraceError(f'{where}: give "xid" or "signal", not both')
    cause = obj.get("cause", "")
    if not isinstance(cause, str) or len(cause) > MAX_CAUSE_CHARS or not cause.isprintable():
        raise TraceError(f'{where}: "cause" must be printable text of at most {MAX_CAUSE_CHARS} characters')
    recurrence = obj.get("recurrence", False)
    if not isinstance(recurrence, bool):
        raise TraceError(f'{where}: "recurrence" is true or false, not {recurrence!r}')
    base = {
        "time_ns": _time_ns(obj.get("time"), where),
        "node": node,
        "gpu": gpu,
        "label": label,
        "cause": cause,
        "recurrence": recurrence,
    }
    if xid is not None:
        if isinstance(xid, bool) or not isinstance(xid, int) or not 1 <= xid <= 1_000_000:
            raise TraceError(f'{where}: "xid" = {xid!r}; give the XID number')
        return FaultInput(**base, xid=xid, message=message[:512], count=count)
    model = _model(obj, signal, where)
    if signal is not None:
        return FaultInput(**base, signal=signal, value=_signal_value(obj, signal, gpu, where), model=model)
    if not label:
        raise TraceError(f'{where}: give "xid" or "signal" (or a "label" for a fault gpufleet cannot see)')
    return FaultInput(**base, message=message[:512])


def _model(obj: dict[str, Any], signal: object, where: str) -> str:
    """An engine signal's model ("" for any other input)."""
    model = obj.get("model")
    if (model is not None) != (signal in ENGINE_SIGNALS):
        raise TraceError(
            f'{where}: "model" goes with an engine signal ({", ".join(ENGINE_SIGNALS)}) and only with one'
        )
    if model is None:
        return ""
    if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_CHARS or not model.isprintable():
        raise TraceError(
            f'{where}: "model" = {model!r}; give the served model name, printable, '
            f"1 to {MAX_MODEL_CHARS} characters"
        )
    return model


def _common(obj: dict[str, Any], where: str) -> tuple[str, int | None, str, str, int]:
    """(node, gpu, label, message, count) of a trace line, each checked."""
    node = obj.get("node")
    if not isinstance(node, str) or node_name_problem(node):
        why = node_name_problem(node) if isinstance(node, str) else "it is not text"
        raise TraceError(f'{where}: "node" = {node!r} is no node name: {why}')
    gpu = obj.get("gpu")
    if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < MAX_GPUS):
        raise TraceError(
            f'{where}: "gpu" = {gpu!r}; give a GPU index from 0 to {MAX_GPUS - 1}, or leave it out'
        )
    label = obj.get("label", "")
    if label not in ("", *LABELS):
        raise TraceError(f'{where}: "label" = {label!r}; use one of {", ".join(LABELS)}')
    message = obj.get("message", "")
    if not isinstance(message, str):
        raise TraceError(f'{where}: "message" must be text')
    count = obj.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 2**32:
        raise TraceError(f'{where}: "count" = {count!r}; give how many identical XIDs (1 or more)')
    return node, gpu, label, message, count


def _signal_value(obj: dict[str, Any], signal: object, gpu: int | None, where: str) -> float:
    """A signal's value, checked against the field it sets."""
    if signal not in SIGNALS:
        raise TraceError(
            f'{where}: "signal" = {signal!r} is not a field gpufleet samples; use one of {", ".join(SIGNALS)}'
        )
    value = obj.get("value")
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, int | float) or not math.isfinite(value) or not -1e18 <= value <= 1e18:
        raise TraceError(f'{where}: "value" = {value!r} for signal {signal}; give a finite number')
    if signal in ENGINE_SIGNALS:
        return _engine_value(signal, value, gpu, where)
    if signal in NODE_SIGNALS:
        if gpu is not None:
            raise TraceError(f'{where}: {signal} is about the node: leave out "gpu"')
        if signal == REPORTING and value not in (0, 1):
            raise TraceError(f"{where}: {REPORTING} is 0 or 1, not {value!r}")
        if not 0 <= value <= MAX_GPUS or value != int(value):
            raise TraceError(f"{where}: {signal} is a GPU count: give a whole number 0 to {MAX_GPUS}")
        return float(value)
    assert isinstance(signal, str)
    field = _GPU_FIELDS[signal]
    if gpu is None:
        raise TraceError(f'{where}: signal {signal} is a GPU field: give "gpu"')
    if field.type == field.TYPE_BOOL and value not in (0, 1):
        raise TraceError(f"{where}: signal {signal} is true or false: give 0 or 1, not {value!r}")
    if field.type != field.TYPE_DOUBLE and (value < 0 or value != int(value)):
        raise TraceError(f"{where}: signal {signal} is a count: give a whole number ≥ 0, not {value!r}")
    return float(value)


def _engine_value(signal: str, value: float, gpu: int | None, where: str) -> float:
    if gpu is not None:
        raise TraceError(f'{where}: {signal} is about an engine replica: leave out "gpu", give "model"')
    if not 0 <= value <= (1 if signal == KV_CACHE else 1e9):
        top = "1 (a ratio)" if signal == KV_CACHE else "10^9"
        raise TraceError(f"{where}: {signal} = {value!r}; give 0 to {top}")
    return float(value)


def load_trace(path: str | Path, nodes: int = 0, gpus_per_node: int = 8) -> FaultHistory:
    """A trace file as a history; TraceError names the first bad line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace {path}: {exc}") from exc
    inputs = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
        inputs.append(parse_input(obj, where))
        if len(inputs) > MAX_INPUTS:
            raise TraceError(f"{path}: more than {MAX_INPUTS} inputs; split the trace by time")
    if not inputs:
        raise TraceError(f"{path}: no inputs (one JSON object per line)")
    return FaultHistory.of(inputs, f"trace {path}", nodes, gpus_per_node)
