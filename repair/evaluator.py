"""The health rules over one node's snapshot, with each finding's persistence window.

A finding's window starts when it is first seen active; that time is kept in the repair
state, so an aggregator restart does not restart every window from zero. A finding a person
overrode (they returned the node with it active) stays suppressed while it is still active,
and a finding older than the node's last closed incident is already dealt with."""

from __future__ import annotations

from dataclasses import replace

from gpufleet.repair.kept_values import KeptValues
from gpufleet.repair.model import Finding, NodeSnapshot
from gpufleet.repair.policy import Policy
from gpufleet.repair.rules import RULES
from gpufleet.repair.state import Workflow


def finding_id(f: Finding) -> str:
    """A finding's identity on its node, as a person's override names it."""
    return f"{'-' if f.gpu is None else f.gpu}:{f.code}"


class Evaluator:
    def __init__(self, policy: Policy, state: KeptValues) -> None:
        self.policy = policy
        self._state = state
        self.rules = {name: factory() for name, factory in RULES.items()}
        self._restarting = {name for name, rule in self.rules.items() if rule.window_from_seen}
        # node -> finding key -> first seen (ns): by node, so a node's evaluation touches only
        # its own entries, not the whole fleet's.
        self._first_seen: dict[str, dict[tuple[str, int | None, str], int]] = {}
        # node -> finding key -> the pass that first raised it (ns): the finding's detection
        # time, which surfaces show (its window may start earlier). In memory: after a restart a
        # finding still active is detected again (its incident keeps the first time).
        self._detected: dict[str, dict[tuple[str, int | None, str], int]] = {}
        for key, seen_ns in state.first_seen().items():
            self._first_seen.setdefault(key[0], {})[key] = seen_ns

    def evaluate(self, wf: Workflow, snap: NodeSnapshot, now: int) -> list[Finding]:
        """The node's active findings, less those overridden or already dealt with."""
        found: list[Finding] = []
        for name, rule in self.rules.items():
            entry = self.policy.rules.get(name)
            if entry is not None and not entry.enabled:
                continue
            found += rule.evaluate(snap, entry or self.policy.buckets["IGNORE"], self.policy, now)
        # An override lasts while its finding is active; a rule that sees nothing for one
        # pass (a report without the GPU's sample) does not end it: only a clean pass with the
        # GPU present does, which the rule reports by not finding it with the sample there.
        active_ids = {finding_id(f) for f in found}
        present = set(snap.gpus)
        wf.suppressed = [s for s in wf.suppressed if s in active_ids or not _gpu_present(s, present)]
        found = [f for f in found if finding_id(f) not in wf.suppressed and f.seen_ns >= wf.cleared_before_ns]
        keys = {f.key for f in found}
        found = self._stamp(snap.node, found, keys, now)
        mine = self._first_seen.get(snap.node)
        if mine is None:
            if not found:
                return found
            mine = self._first_seen[snap.node] = {}
        gone = [k for k in mine if k not in keys]
        for key in gone:
            del mine[key]
        new = {}
        for f in found:
            if f.key not in mine or (f.code in self._restarting and f.seen_ns > mine[f.key]):
                new[f.key] = mine[f.key] = min(f.seen_ns or now, now)
        if not mine:
            del self._first_seen[snap.node]
        if gone or new:
            self._state.put_first_seen(snap.node, gone, new)
        return found

    def _stamp(
        self, node: str, found: list[Finding], keys: set[tuple[str, int | None, str]], now: int
    ) -> list[Finding]:
        """The findings with their detection time (the pass that first raised each)."""
        detected = self._detected.get(node)
        if detected is None:
            if not found:
                return found
            detected = self._detected[node] = {}
        for key in [k for k in detected if k not in keys]:
            del detected[key]
        out = [replace(f, detected_ns=detected.setdefault(f.key, max(now, f.seen_ns))) for f in found]
        if not detected:
            del self._detected[node]
        return out

    def _seen(self, f: Finding, default: int) -> int:
        return self._first_seen.get(f.node, {}).get(f.key, default)

    def first_seen_ns(self, f: Finding) -> int:
        """When this finding was first seen active (its persistence window's start)."""
        return self._seen(f, f.seen_ns)

    def persisted(self, f: Finding, now: int) -> bool:
        return now - self._seen(f, now) >= f.window_s * 1e9

    def left_s(self, f: Finding, now: int) -> float:
        return f.window_s - (now - self._seen(f, now)) / 1e9


def _gpu_present(finding: str, present: set[int]) -> bool:
    gpu = finding.split(":", 1)[0]
    return gpu == "-" or (gpu.isdigit() and int(gpu) in present)
