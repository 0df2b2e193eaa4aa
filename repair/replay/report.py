"""What a replay did, measured from its own audit log and incidents (docs/architecture.md
"Policy replay"; every figure is defined in docs/repair.md, "Policy replay"):

- nodes_taken_out: nodes automation cordoned, in the order of their first cordon;
- gpu_hours_out_of_service: from each automatic cordon to the node's return (automatic
  uncordon, or a person's), or the end of the history; x the node's GPUs;
- faults by label, and by cause where the history names one: a fault is the labeled inputs on
  one node, GPU, label and cause within 60 s of each other (an XID and the signals it comes
  with). caught: one of its inputs triggered an automatic cordon (it is in the cordoning
  incident's findings, seen by then); while_out: it came while its node was already out of
  service; invisible: it shows no signal gpufleet reads; alerted: not cordoned, but a finding
  of its kind was raised for its node and GPU (an alert-only rule: a person was told);
  missed: the rest of the hardware and software ones; left_in_service: the rest of the
  application and benign ones (nothing to repair: not taking the node out is right);
- false_cordons: cordons whose triggering inputs are all labeled application or benign;
- precision: cordons with a hardware or software trigger / cordons with a labeled trigger;
  recall: hardware and software faults caught / those visible and not already out of service
  (an alerted one counts as not caught; recall_all counts the invisible ones too);
- detect_latency_s: from a caught hardware or software fault's first input to its cordon;
- actions: automatic cordons, drains, GPU resets, reboots and tickets begun, quarantines and
  returns; breaker_trips; lemon_nodes: nodes with repeat_offender_incidents incidents within
  repeat_offender_days at some point;
- serving (a history with engine readings): pool_minutes_below_floor, summed over the pools, the
  time each pool's serving replicas carried more than the floor's KV-cache usage or were fewer
  than its minimum; repair_delay_added_s, the time drains waited for capacity (the capacity
  guard): the trade-off between the two is what a [serving] floor chooses."""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

from gpufleet.common.timefmt import iso
from gpufleet.repair.health import Health
from gpufleet.repair.incidents import AUTOMATION
from gpufleet.repair.outcome import Status
from gpufleet.repair.replay.engine import TECHNICIAN, ReplayRun
from gpufleet.repair.replay.history import ACTIONABLE, LABELS, FaultInput
from gpufleet.repair.state import AuditRecord

FAULT_GAP_NS = 60 * 10**9
_ALL = 10**9


OUTCOMES = (
    "total",
    "interruptions",
    "recurrences",
    "caught",
    "alerted",
    "missed",
    "left_in_service",
    "while_out",
    "invisible",
)


@dataclass
class Fault:
    node: str
    gpu: int | None
    label: str
    inputs: list[FaultInput]
    cause: str = ""

    @property
    def time_ns(self) -> int:
        return self.inputs[0].time_ns

    @property
    def ident(self) -> str:
        where = f"{self.node}" + (f"/gpu{self.gpu}" if self.gpu is not None else "")
        what = ",".join(dict.fromkeys(f"xid {i.xid}" if i.xid else i.signal or "unseen" for i in self.inputs))
        return f"{iso(self.time_ns)} {where} {self.label} ({what})"


def faults_of(inputs: list[FaultInput]) -> list[Fault]:
    open_: dict[tuple[str, int | None, str], Fault] = {}
    out = []
    for i in inputs:
        if not i.label:
            continue
        key = (i.node, i.gpu, i.label, i.cause)
        fault = open_.get(key)
        if fault is not None and i.time_ns - fault.inputs[-1].time_ns <= FAULT_GAP_NS:
            fault.inputs.append(i)
            continue
        fault = open_[key] = Fault(i.node, i.gpu, i.label, [i], i.cause)
        out.append(fault)
    return out


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


Intervals = dict[str, list[tuple[int, int]]]


def summarize(run: ReplayRun) -> dict[str, Any]:
    history, policy = run.history, run.policy
    audit = run.state.audit_log(limit=_ALL)
    incidents = {i.id: i for i in run.state.incidents(limit=_ALL)}
    by_node: dict[str, list[FaultInput]] = defaultdict(list)
    for i in history.inputs:
        by_node[i.node].append(i)
    lookback_ns = int(policy.workflow["xid_lookback_s"] * 1e9)

    cordons = [a for a in audit if a.actor == AUTOMATION and a.action == "cordon" and a.outcome.ok]
    triggers = [_triggering(c, incidents, by_node[c.node], lookback_ns) for c in cordons]
    intervals = _out_of_service(audit, history.end_ns)
    gpu_hours = sum(
        (end - start) / 3.6e12 * history.gpu_count(node)
        for node, spans in intervals.items()
        for start, end in spans
    )
    by_label, by_cause, fault_outcome, latencies = _classify_faults(
        history.inputs, cordons, triggers, intervals, list(incidents.values())
    )

    labeled = [t for t in triggers if any(i.label for i in t)]
    true_cordons = [t for t in labeled if any(i.label in ACTIONABLE for i in t)]
    actionable = [by_label[label] for label in ACTIONABLE]
    caught = sum(r["caught"] for r in actionable)
    seen = sum(r["caught"] + r["missed"] + r["alerted"] for r in actionable)  # alerted: not taken out
    everything = sum(r["total"] - r["while_out"] for r in actionable)
    taken_out = list(dict.fromkeys(c.node for c in cordons))
    return {
        "source": history.source,
        "policy": list(policy.sources),
        "fleet": {"nodes": len(history.nodes), "gpus_per_node": history.gpus_per_node},
        "from": iso(history.start_ns),
        "until": iso(history.end_ns),
        "inputs": len(history.inputs),
        "passes": run.passes,
        "wall_s": round(run.wall_s, 2),
        "nodes_taken_out": len(taken_out),
        "nodes_taken_out_in_order": taken_out,
        "gpu_hours_out_of_service": round(gpu_hours, 1),
        "faults": by_label,
        "causes": by_cause,
        "false_cordons": len(labeled) - len(true_cordons),
        "unlabeled_cordons": len(cordons) - len(labeled),
        "precision": round(len(true_cordons) / len(labeled), 3) if labeled else None,
        "recall": round(caught / seen, 3) if seen else None,
        "recall_all": round(caught / everything, 3) if everything else None,
        "detect_latency_s": {
            "p50": _percentile(latencies, 50),
            "p99": _percentile(latencies, 99),
            "n": len(latencies),
        },
        "actions": _actions(audit, len(cordons)),
        "breaker_trips": sum(1 for a in audit if a.action == "breaker_trip"),
        "lemon_nodes": _lemons(run),
        "lemon_rule": (
            f"nodes with {run.policy.workflow['repeat_offender_incidents']:g} or more incidents within "
            f"{run.policy.workflow['repeat_offender_days']:g} days (repeat_offender_*): each recurrence "
            "of a faulty part opens another incident"
        ),
        "out_of_service": _series(intervals, history),
        "fault_outcomes": fault_outcome,
        "nodes": _steps_by_node(audit),
        "in_repair_at_end": _in_repair_at_end(run),
        "serving": _serving(run),
    }


# States in which the automation still has a step to take: a node in one of them when the
# history ends had its workflow cut short by the window, not finished differently.
_MID_REPAIR = {
    Health.SUSPECT,
    Health.CORDONED,
    Health.DRAINING,
    Health.REPAIRING,
    Health.VALIDATING,
    Health.WAITING,
}


def _in_repair_at_end(run: ReplayRun) -> dict[str, str]:
    """Each node whose repair was still under way when the history ended, with its state: its
    steps stop there because the window did (a replay of a store asked the moment a live repair
    ended stops a second or so short of it: a recorded reset's answer is read at the next stored
    sample), not because the replay decided otherwise."""
    return {
        node: str(wf.state) for node, wf in sorted(run.state.workflows().items()) if wf.state in _MID_REPAIR
    }


def _serving(run: ReplayRun) -> dict[str, Any] | None:
    s = run.serving
    if s is None:
        return None
    waits = [w for _, w in s.capacity_waits_s]
    return {
        "pools": len(s.pools),
        "floor": {
            "max_kv_cache_usage_ratio": run.policy.serving.max_kv_cache_usage_ratio,
            "min_serving_replicas": run.policy.serving.min_serving_replicas,
            "guard": run.policy.serving.guard,
        },
        "pool_minutes_below_floor": round(sum(s.seconds_below_floor.values()) / 60, 1),
        "pool_minutes_below_floor_by_model": {
            m: round(v / 60, 1) for m, v in sorted(s.seconds_below_floor.items())
        },
        "repairs_waited_for_capacity": len(waits),
        "repair_delay_added_s": {
            "total": round(sum(waits), 1),
            "p50": None if not waits else round(_percentile(waits, 50) or 0.0, 1),
            "max": None if not waits else round(max(waits), 1),
        },
    }


def _out_of_service(audit: list[AuditRecord], end_ns: int) -> Intervals:
    """Each node's spans out of service: an automatic cordon until the node's return (an
    uncordon by anyone), or the end of the history."""
    intervals: Intervals = defaultdict(list)
    out_since: dict[str, int] = {}
    for a in audit:
        if a.action == "cordon" and a.outcome.ok and a.actor == AUTOMATION:
            out_since.setdefault(a.node, a.time_ns)
        elif a.action == "uncordon" and a.outcome.ok and a.node in out_since:
            intervals[a.node].append((out_since.pop(a.node), a.time_ns))
    for node, since in out_since.items():
        intervals[node].append((since, max(since, end_ns)))
    return intervals


def _classify_faults(
    inputs: list[FaultInput],
    cordons: list[AuditRecord],
    triggers: list[list[FaultInput]],
    intervals: Intervals,
    incidents: list[Any],
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]], dict[str, str], list[float]]:
    """Each fault as caught, invisible, while_out, alerted or missed (counted by label and by
    cause, named by its ident), and the detection latency of the caught hardware and software
    ones."""
    caught_at: dict[int, int] = {}  # id(input) -> cordon time
    for cordon, trigger in zip(cordons, triggers, strict=True):
        for i in trigger:
            caught_at.setdefault(id(i), cordon.time_ns)
    # Every finding raised, cordoning or not: (gpu, code, seen) by node.
    raised: dict[str, list[tuple[int | None, str, int]]] = defaultdict(list)
    for incident in incidents:
        for finding in incident.findings:
            raised[incident.node].append((finding.gpu, finding.code, finding.seen_ns))
    by_label = {label: dict.fromkeys(OUTCOMES, 0) for label in LABELS}
    by_cause: dict[str, dict[str, int]] = {}
    latencies: list[float] = []
    fault_outcome: dict[str, str] = {}
    for f in faults_of(inputs):
        times = [caught_at[id(i)] for i in f.inputs if id(i) in caught_at]
        codes = frozenset().union(*(i.codes for i in f.inputs))
        if times:
            outcome = "caught"
            if f.label in ACTIONABLE:
                latencies.append((min(times) - f.time_ns) / 1e9)
        elif not any(i.visible for i in f.inputs):
            outcome = "invisible"
        elif any(start <= f.time_ns < end for start, end in intervals.get(f.node, [])):
            outcome = "while_out"
        elif any(
            code in codes and (gpu is None or f.gpu is None or gpu == f.gpu) and seen >= f.time_ns
            for gpu, code, seen in raised.get(f.node, [])
        ):
            outcome = "alerted"
        else:
            # Not taking a node out for an application error or a benign event is right, not a miss.
            outcome = "missed" if f.label in ACTIONABLE else "left_in_service"
        for counts in (
            by_label[f.label],
            *([by_cause.setdefault(f.cause, dict.fromkeys(OUTCOMES, 0))] if f.cause else []),
        ):
            counts["total"] += 1
            counts["recurrences" if f.inputs[0].recurrence else "interruptions"] += 1
            counts[outcome] += 1
        fault_outcome[f.ident] = outcome
    return by_label, dict(sorted(by_cause.items())), fault_outcome, latencies


def _actions(audit: list[AuditRecord], cordons: int) -> dict[str, int]:
    """Automation's actions: completed ones (ok) and long ones begun (started)."""
    auto = [a for a in audit if a.actor == AUTOMATION]

    def done(action: str) -> int:
        return sum(1 for a in auto if a.action == action and a.outcome.ok)

    def begun(action: str) -> int:
        return sum(1 for a in auto if a.action == action and a.outcome.status is Status.STARTED)

    return {
        "cordon": cordons,
        "drain": done("drain"),
        "reset_gpu": begun("reset_gpu"),
        "reboot": begun("reboot"),
        "ticket": begun("ticket"),
        "quarantine": done("quarantine"),
        "uncordon": done("uncordon"),
        "returned_by_technician": sum(1 for a in audit if a.actor == TECHNICIAN and a.action == "uncordon"),
    }


def _steps_by_node(audit: list[AuditRecord]) -> dict[str, list[dict[str, str]]]:
    steps: dict[str, list[dict[str, str]]] = defaultdict(list)
    for a in audit:
        if a.node and a.actor in (AUTOMATION, TECHNICIAN):
            steps[a.node].append(
                {
                    "time": iso(a.time_ns),
                    "action": a.action,
                    "outcome": str(a.outcome)[:120],
                    "reason": a.reason[:160],
                }
            )
    return dict(steps)


def _triggering(
    cordon: AuditRecord, incidents: dict[str, Any], inputs: list[FaultInput], lookback_ns: int
) -> list[FaultInput]:
    """The inputs behind a cordon: for each finding in its incident seen by then, the XIDs of
    its code on its GPU within the look-back, or the latest input that set its signal."""
    incident = incidents.get(cordon.incident_id)
    if incident is None:
        return []
    found: list[FaultInput] = []
    for f in incident.findings:
        if f.seen_ns > cordon.time_ns:
            continue
        matching = [
            i
            for i in inputs
            if i.time_ns <= cordon.time_ns and f.code in i.codes and (f.gpu is None or i.gpu == f.gpu)
        ]
        if f.code.startswith("xid_"):
            found += [i for i in matching if cordon.time_ns - i.time_ns <= lookback_ns]
        else:
            setting = [i for i in matching if i.value]
            if setting:
                found.append(setting[-1])
    return list({id(i): i for i in found}.values())


def _lemons(run: ReplayRun) -> list[str]:
    n = int(run.policy.workflow["repeat_offender_incidents"])
    span = int(run.policy.workflow["repeat_offender_days"] * 86400e9)
    opened: dict[str, list[int]] = defaultdict(list)
    for incident in run.state.incidents(limit=_ALL):
        opened[incident.node].append(incident.opened_ns)
    lemons = []
    for node, times in opened.items():
        times.sort()
        if n and any(times[k + n - 1] - times[k] <= span for k in range(len(times) - n + 1)):
            lemons.append(node)
    return sorted(lemons)


def _series(intervals: Intervals, history: Any) -> dict[str, list[Any]]:
    """GPUs out of service over time: a step at every cordon and return."""
    steps: list[tuple[int, int]] = []
    for node, spans in intervals.items():
        gpus = history.gpu_count(node)
        for start, end in spans:
            steps += [(start, gpus), (end, -gpus)]
    steps.sort()
    times, values, level = [iso(history.start_ns)], [0], 0
    for t, d in steps:
        level += d
        times.append(iso(t))
        values.append(level)
    times.append(iso(history.end_ns))
    values.append(level)
    return {"time": times, "gpus_out": values}


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """What differs between two replays of one history: nodes, faults, figures."""
    nodes_a, nodes_b = set(a["nodes_taken_out_in_order"]), set(b["nodes_taken_out_in_order"])
    fa, fb = a["fault_outcomes"], b["fault_outcomes"]
    return {
        "nodes_taken_out_only_by_a": sorted(nodes_a - nodes_b),
        "nodes_taken_out_only_by_b": sorted(nodes_b - nodes_a),
        "faults_caught_only_by_a": sorted(
            k for k, v in fa.items() if v == "caught" and fb.get(k) != "caught"
        ),
        "faults_caught_only_by_b": sorted(
            k for k, v in fb.items() if v == "caught" and fa.get(k) != "caught"
        ),
        "figures": {
            k: {"a": a[k], "b": b[k]}
            for k in (
                "nodes_taken_out",
                "gpu_hours_out_of_service",
                "false_cordons",
                "precision",
                "recall",
                "breaker_trips",
            )
            if a[k] != b[k]
        }
        | {
            k: {"a": a["serving"][k], "b": b["serving"][k]}
            for k in ("pool_minutes_below_floor", "repairs_waited_for_capacity")
            if a.get("serving") and b.get("serving") and a["serving"][k] != b["serving"][k]
        },
    }


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _outcomes(f: dict[str, int], actionable: bool | None = None) -> str:
    """One label's or cause's faults in words: for application errors and benign events (not
    actionable; a cause: by its counts) "taken out" and "left in service", not caught/missed."""
    alerted = f", {f['alerted']} alerted" if f["alerted"] else ""
    again = (
        f" ({f['interruptions']} interruptions + {f['recurrences']} recurrences)" if f["recurrences"] else ""
    )
    if actionable is None:
        actionable = bool(f["missed"] or not f["left_in_service"])
    if actionable:
        fate = f"{f['caught']} caught{alerted}, {f['missed']} missed"
    else:  # application errors and benign events: taking the node out would be the mistake
        fate = f"{f['caught']} taken out{alerted}, {f['left_in_service']} left in service"
    return f"{f['total']}{again}: {fate}, {f['while_out']} while out, {f['invisible']} invisible"


def _in_repair(nodes: dict[str, str]) -> str:
    shown = ", ".join(f"{n} {state}" for n, state in list(nodes.items())[:5])
    more = ", ..." if len(nodes) > 5 else ""
    return f"{len(nodes)} ({shown}{more}: cut short by the history's end)" if nodes else "0"


def _figures(r: dict[str, Any]) -> list[tuple[str, str]]:
    lat = r["detect_latency_s"]
    rows = [
        ("nodes taken out", str(r["nodes_taken_out"])),
        ("GPU-hours out of service", f"{r['gpu_hours_out_of_service']:,.1f}"),
    ]
    for label, f in r["faults"].items():
        if f["total"]:
            rows.append((f"{label} faults", _outcomes(f, label in ACTIONABLE)))
    for cause, f in r.get("causes", {}).items():
        rows.append((f"  {cause}", _outcomes(f)))
    rows += [
        ("false cordons", str(r["false_cordons"])),
        ("precision", "-" if r["precision"] is None else f"{r['precision']:.3f}"),
        (
            "recall (visible / all)",
            f"{_num(r['recall'])} / {_num(r['recall_all'])}",
        ),
        (
            "detect latency p50 / p99",
            "-" if lat["p50"] is None else f"{lat['p50']:.0f} s / {lat['p99']:.0f} s (n={lat['n']})",
        ),
        ("actions", ", ".join(f"{k} {v}" for k, v in r["actions"].items())),
        ("breaker trips", str(r["breaker_trips"])),
        ("in repair at the end", _in_repair(r.get("in_repair_at_end", {}))),
        (
            "lemon nodes",
            str(len(r["lemon_nodes"]))
            + (
                f" ({', '.join(r['lemon_nodes'][:5])}{', ...' if len(r['lemon_nodes']) > 5 else ''})"
                if r["lemon_nodes"]
                else ""
            )
            + f" — {r.get('lemon_rule', '')}",
        ),
        ("replay", f"{r['inputs']} inputs, {r['passes']} passes, {r['wall_s']:.1f} s"),
    ]
    serving = r.get("serving")
    if serving:
        delay = serving["repair_delay_added_s"]
        floor = serving["floor"]
        rows[-1:-1] = [
            (
                "serving floor",
                f"KV ≤ {floor['max_kv_cache_usage_ratio']:g}, ≥ {floor['min_serving_replicas']} replicas"
                + ("" if floor["guard"] else " (guard off)"),
            ),
            (
                "pool-minutes below floor",
                f"{serving['pool_minutes_below_floor']:,.1f} (over {serving['pools']} pool(s))",
            ),
            (
                "repair delay added",
                f"{delay['total']:,.0f} s, {serving['repairs_waited_for_capacity']} repair(s) waited"
                + ("" if delay["max"] is None else f" (p50 {delay['p50']:.0f} s, max {delay['max']:.0f} s)"),
            ),
        ]
    return rows


# The widest a column of --compare gets (with the figure names, both fit 120 columns of terminal).
COMPARE_COLUMN = 42


def render(report: dict[str, Any], other: dict[str, Any] | None = None, nodes: int = 10) -> str:
    """The report as a table (two columns with --compare), and the first nodes' steps."""
    fleet = report["fleet"]
    lines = [
        f"replay of {report['source']}: {report['from']} .. {report['until']}, "
        f"{fleet['nodes']} nodes x {fleet['gpus_per_node']} GPUs"
    ]
    a = _figures(report)
    if other is None:
        width = max(len(k) for k, _ in a)
        lines += [f"  {k:<{width}}  {v}" for k, v in a]
    else:
        b = dict(_figures(other))
        width = max(len(k) for k, _ in a)
        col = min(COMPARE_COLUMN, max(len(v) for _, v in [*a, *b.items()]))
        heads = [("", "A: " + ", ".join(report["policy"]), "B: " + ", ".join(other["policy"]))]
        for k, va, vb in heads + [(k, v, b.get(k, "")) for k, v in a]:
            # A long figure wraps inside its column at a word: never cut, never pushing B off a terminal.
            wrapped = zip_longest(
                textwrap.wrap(va, col, break_on_hyphens=False) or [""],
                textwrap.wrap(vb, col, break_on_hyphens=False) or [""],
                fillvalue="",
            )
            for n, (la, lb) in enumerate(wrapped):
                lines.append(f"  {k if n == 0 else '':<{width}}  {la:<{col}}  {lb}".rstrip())
        diff = compare(report, other)
        for key, title in (
            ("nodes_taken_out_only_by_a", "nodes taken out only by A"),
            ("nodes_taken_out_only_by_b", "nodes taken out only by B"),
            ("faults_caught_only_by_a", "faults caught only by A"),
            ("faults_caught_only_by_b", "faults caught only by B"),
        ):
            items = diff[key]
            lines.append(f"  {title}: {len(items)}")
            lines += [f"    {item}" for item in items[:8]]  # one a line: each is a sentence
            if len(items) > 8:
                lines.append(f"    ... and {len(items) - 8} more (--json lists them all)")
    shown = report["nodes_taken_out_in_order"][:nodes]
    if shown:
        lines.append(f"steps on the first {len(shown)} node(s) taken out (all of them: --json):")
        for node in shown:
            lines.append(f"  {node}")
            for s in report["nodes"].get(node, [])[:12]:
                outcome = textwrap.shorten(s["outcome"], 30, placeholder=" ...")
                reason = textwrap.shorten(s["reason"], 56, placeholder=" ...")
                lines.append(f"    {s['time']}  {s['action']:<10} {outcome:<30} {reason}".rstrip())
    return "\n".join(lines)
