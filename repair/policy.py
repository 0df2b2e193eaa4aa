"""The health policy: shipped defaults (default_policy.toml) plus a separate local override
file, validated with errors that name the file, the key and the value.

Overrides replace the defaults key by key: `[rules.thermal_slowdown] window_s = 120` changes
only that window. `[[xid_workflow]]` and `[xid.N]` tables in an override file are added to
(or, for the same XID, replace) the shipped ones."""

from __future__ import annotations

import importlib.resources
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gpufleet.protos.names import ACTIONS
from gpufleet.repair import xid_catalog
from gpufleet.repair.health import Step
from gpufleet.repair.model import DEFAULT_LADDER, LADDER_STEPS, SEVERITIES, Finding
from gpufleet.repair.placement import Placement, placement_from_table
from gpufleet.repair.serving import ServingFloor


def rule_names() -> tuple[str, ...]:
    """The rules with a [rules.NAME] table: every registered rule but xid (which reads
    [buckets], [xid] and [[xid_workflow]]). Imported here, not at the top: the rules import
    this module for Entry and Policy."""
    from gpufleet.repair.rules import RULES

    return tuple(name for name in RULES if name != "xid")


def rule_threshold_limits() -> dict[str, float]:
    """The rules whose threshold is a fraction, with the bound it must stay under."""
    from gpufleet.repair.rules import RULES

    return {
        name: limit for name, factory in RULES.items() if (limit := getattr(factory, "threshold_max", None))
    }


_ENTRY_KEYS = {
    "severity",
    "cordon",
    "ladder",
    "reason",
    "window_s",
    "action",
    "threshold",
    "enabled",
    "may_wait",
}
_WORKFLOW_DEFAULTS = {
    "validate_s": 60.0,
    "reset_timeout_s": 120.0,
    "reboot_timeout_s": 900.0,
    "repeat_offender_incidents": 3,
    "repeat_offender_days": 7.0,
    "lemon_quarantine": 1.0,  # true/false in the file: a lemon node goes to quarantine (1) or is only flagged
    "xid_lookback_s": 3600.0,
}


_WORKFLOW_FLAGS = frozenset({"lemon_quarantine"})  # true/false keys of [workflow]
# [waste]: what the waste rules (repair/rules/waste.py) read beside their [rules.*] tables.
_WASTE_DEFAULTS = {
    # A GPU holding at least this share of its HBM is not idle, whatever its utilization (Job
    # Defense Shield's gpu_mem_eff_pct, asked for by its users: a job that fills memory and
    # computes little may be memory-bound). 0: off, the default (HBM held alone is not work).
    "idle_hbm_exempt_ratio": 0.0,
}


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the file, key and value."""


@dataclass(frozen=True)
class Entry:
    """What the policy says about one kind of finding."""

    severity: str
    action: str
    cordon: bool
    reason: str
    ladder: tuple[Step, ...] = ()
    window_s: float = 0.0
    threshold: float = 0.0
    enabled: bool = True
    may_wait: bool = False  # its drain may wait for serving capacity (repair/capacity.py)

    def finding(
        self, node: str, gpu: int | None, code: str, evidence: str, seen_ns: int, workload: str = ""
    ) -> Finding:
        return Finding(
            node,
            gpu,
            code,
            self.severity,
            self.action,
            self.cordon,
            self.reason,
            evidence,
            self.window_s,
            self.ladder,
            seen_ns,
            self.may_wait,
            workload,
        )


@dataclass(frozen=True)
class XidWorkflow:
    xid: int
    with_xids: frozenset[int]
    within_s: float
    entry: Entry


@dataclass
class Policy:
    buckets: dict[str, Entry]
    xids: dict[int, Entry]  # per-XID overrides
    workflows: list[XidWorkflow]
    rules: dict[str, Entry]
    workflow: dict[str, float] = field(default_factory=lambda: dict(_WORKFLOW_DEFAULTS))
    serving: ServingFloor = field(default_factory=ServingFloor)
    placement: Placement = field(default_factory=Placement)  # [serving.pools]: repair/placement.py
    waste: dict[str, float] = field(default_factory=lambda: dict(_WASTE_DEFAULTS))
    sources: tuple[str, ...] = ()

    def xid_entry(self, xid: int, with_xids: set[int] | frozenset[int] = frozenset()) -> tuple[Entry, str]:
        """The entry for an XID (given the XIDs seen with it) and why: which table decided."""
        for wf in self.workflows:
            if wf.xid == xid and wf.with_xids & set(with_xids):
                return wf.entry, f"multi-XID workflow {xid} with {sorted(wf.with_xids & set(with_xids))}"
        if xid in self.xids:
            return self.xids[xid], f"local override [xid.{xid}]"
        bucket = xid_catalog.BUCKET.get(xid)
        if bucket is None:
            # An XID newer than the catalog we ship: a person should look at it.
            entry = self.buckets["CONTACT_SUPPORT"]
            return (
                Entry(
                    entry.severity,
                    "CONTACT_SUPPORT",
                    entry.cordon,
                    f"XID {xid} is not in {xid_catalog.CATALOG_VERSION}: treated as CONTACT_SUPPORT",
                    entry.ladder,
                    entry.window_s,
                ),
                "not in the catalog",
            )
        return self.buckets[bucket], f"catalog bucket {bucket}"

    def explain_xid(self, xid: int, with_xids: set[int] | frozenset[int] = frozenset()) -> dict[str, Any]:
        entry, why = self.xid_entry(xid, with_xids)
        return {
            "xid": xid,
            "mnemonic": xid_catalog.MNEMONICS.get(xid, ""),
            "with_xids": sorted(with_xids),
            "severity": entry.severity,
            "action": entry.action,
            "cordon": entry.cordon,
            "ladder": list(entry.ladder),
            "window_s": entry.window_s,
            "reason": entry.reason,
            "may_wait": entry.may_wait,
            "decided_by": why,
            "catalog": xid_catalog.CATALOG_VERSION,
        }


def _default_text() -> str:
    return (importlib.resources.files("gpufleet.repair") / "default_policy.toml").read_text()


def _read(path: str | Path) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"policy file {path} is not valid TOML: {exc}") from exc


def _entry(where: str, raw: Any, base: Entry | None, fixed_action: str | None) -> Entry:
    """Validate one table over its base; a bucket's action is the bucket itself (fixed_action)."""
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: must be a table, not {raw!r}")
    allowed = _ENTRY_KEYS - {"action"} if fixed_action else _ENTRY_KEYS
    unknown = set(raw) - allowed
    if unknown:
        raise PolicyError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(allowed))}"
        )
    merged: dict[str, Any] = (
        dict(vars(base))
        if base
        else {
            "severity": "warning",
            "action": "ALERT_ONLY",
            "cordon": False,
            "reason": "",
            "ladder": (),
            "window_s": 0.0,
            "threshold": 0.0,
            "enabled": True,
            "may_wait": False,
        }
    )
    merged.update(raw)
    if fixed_action:
        merged["action"] = fixed_action
    _check_entry(where, merged)
    return Entry(
        merged["severity"],
        merged["action"],
        merged["cordon"],
        merged["reason"],
        tuple(Step(s) for s in merged["ladder"]),
        float(merged["window_s"]),
        float(merged["threshold"]),
        merged["enabled"],
        merged["may_wait"],
    )


def _check_entry(where: str, merged: dict[str, Any]) -> None:
    """Each value of a merged table: known severity and action, flags, a ladder of known steps
    (a cordon needs one), numbers ≥ 0, text."""
    if merged["severity"] not in SEVERITIES:
        raise PolicyError(f"{where}: severity = {merged['severity']!r}; use one of {', '.join(SEVERITIES)}")
    if merged["action"] not in ACTIONS:
        raise PolicyError(f"{where}: action = {merged['action']!r}; use one of {', '.join(ACTIONS)}")
    for key in ("cordon", "enabled", "may_wait"):
        if not isinstance(merged[key], bool):
            raise PolicyError(f"{where}: {key} = {merged[key]!r} must be true or false")
    ladder = merged["ladder"]
    if not isinstance(ladder, list | tuple) or any(step not in LADDER_STEPS for step in ladder):
        raise PolicyError(f"{where}: ladder = {ladder!r}; steps are {', '.join(LADDER_STEPS)}")
    if merged["cordon"] and not ladder:
        example = ", ".join(f'"{s}"' for s in DEFAULT_LADDER)
        raise PolicyError(f"{where}: cordon = true needs a ladder (e.g. [{example}])")
    for key in ("window_s", "threshold"):
        value = merged[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value != value:
            raise PolicyError(f"{where}: {key} = {value!r} must be a number ≥ 0")
    if not isinstance(merged["reason"], str):
        raise PolicyError(f"{where}: reason must be text")


# The tables a policy override file may hold.
POLICY_TABLES = frozenset({"workflow", "serving", "waste", "buckets", "xid", "xid_workflow", "rules"})


def _apply(policy: Policy, data: dict[str, Any], source: str) -> None:
    known = POLICY_TABLES
    unknown = set(data) - known
    if unknown:
        raise PolicyError(
            f"{source}: unknown table(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}"
        )
    _apply_workflow(policy, data.get("workflow", {}), source)
    _apply_serving(policy, data.get("serving", {}), source)
    _apply_waste(policy, data.get("waste", {}), source)
    _apply_buckets(policy, data.get("buckets", {}), source)
    _apply_xids(policy, data.get("xid", {}), source)
    _apply_xid_workflows(policy, data.get("xid_workflow", []), source)
    _apply_rules(policy, data.get("rules", {}), source)


def _apply_workflow(policy: Policy, table: dict[str, Any], source: str) -> None:
    for key, value in table.items():
        if key not in _WORKFLOW_DEFAULTS:
            raise PolicyError(
                f"{source}: [workflow] unknown key {key!r}; known: {', '.join(_WORKFLOW_DEFAULTS)}"
            )
        if key in _WORKFLOW_FLAGS:
            if not isinstance(value, bool):
                raise PolicyError(f"{source}: [workflow] {key} = {value!r} must be true or false")
        elif isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise PolicyError(f"{source}: [workflow] {key} = {value!r} must be a number ≥ 0")
        policy.workflow[key] = float(value)


def _apply_waste(policy: Policy, table: dict[str, Any], source: str) -> None:
    if not isinstance(table, dict):
        raise PolicyError(f"{source}: [waste] must be a table")
    for key, value in table.items():
        if key not in _WASTE_DEFAULTS:
            raise PolicyError(f"{source}: [waste] unknown key {key!r}; known: {', '.join(_WASTE_DEFAULTS)}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise PolicyError(f"{source}: [waste] {key} = {value!r} must be a share from 0 to 1 (0: off)")
        policy.waste[key] = float(value)


def _apply_serving(policy: Policy, table: dict[str, Any], source: str) -> None:
    """[serving]: the floor a repair that may wait keeps each serving pool above, and which
    nodes serve which pool ([serving.pools.NAME]: repair/placement.py)."""
    if not isinstance(table, dict):
        raise PolicyError(f"{source}: [serving] must be a table")
    known = [f.name for f in fields(ServingFloor)]
    values = {name: getattr(policy.serving, name) for name in known}
    for key, value in table.items():
        if key == "pools":
            try:
                policy.placement = placement_from_table(value, source)
            except ValueError as exc:
                raise PolicyError(str(exc)) from None
        elif key in known:
            values[key] = _serving_value(key, value, f"{source}: [serving] {key} = {value!r}")
        else:
            raise PolicyError(f"{source}: [serving] unknown key {key!r}; known: {', '.join(known)}, pools")
    policy.serving = ServingFloor(**values)


_SERVING_FLAGS = ("guard", "graceful_drain", "hold_past_max_capacity_wait")


def _serving_value(key: str, value: Any, where: str) -> Any:
    """One [serving] key's value, checked; PolicyError naming it and what to give."""
    if key in _SERVING_FLAGS:
        if not isinstance(value, bool):
            raise PolicyError(f"{where} must be true or false")
        return value
    if key == "min_serving_replicas":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10_000:
            raise PolicyError(f"{where} must be a whole number from 0 to 10000")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise PolicyError(f"{where} must be a number")
    if key == "max_kv_cache_usage_ratio" and not 0 < value <= 10:
        raise PolicyError(f"{where} must be above 0 and at most 10 (1 is a full cache)")
    if key == "max_capacity_wait_s" and not 0 <= value <= 30 * 86400:
        raise PolicyError(f"{where} must be from 0 to 2592000 (30 days)")
    if key in ("engine_drain_timeout_s", "idle_replica_window_s") and not 0 <= value <= 86400:
        raise PolicyError(f"{where} must be from 0 to 86400 seconds")
    return float(value)


def _apply_buckets(policy: Policy, table: dict[str, Any], source: str) -> None:
    for bucket, raw in table.items():
        if bucket not in ACTIONS:
            raise PolicyError(
                f"{source}: [buckets.{bucket}] is not a catalog bucket; use one of {', '.join(ACTIONS)}"
            )
        policy.buckets[bucket] = _entry(
            f"{source}: [buckets.{bucket}]", raw, policy.buckets.get(bucket), bucket
        )


def _apply_xids(policy: Policy, table: dict[str, Any], source: str) -> None:
    for key, raw in table.items():
        try:
            xid = int(key)
            if not 0 < xid < 1000:
                raise ValueError
        except ValueError:
            raise PolicyError(f"{source}: [xid.{key}]: XID must be a number from 1 to 999") from None
        base = policy.xids.get(xid) or policy.xid_entry(xid)[0]
        if "action" in raw and "ladder" not in raw and raw.get("cordon", base.cordon):
            raw = {**raw, "ladder": list(base.ladder or DEFAULT_LADDER)}
        policy.xids[xid] = _entry(f"{source}: [xid.{xid}]", raw, base, None)


def _apply_xid_workflows(policy: Policy, tables: list[Any], source: str) -> None:
    for i, raw in enumerate(tables):
        where = f"{source}: [[xid_workflow]] #{i + 1}"
        if not isinstance(raw, dict):
            raise PolicyError(f"{where}: must be a table")
        rest = {k: v for k, v in raw.items() if k not in ("xid", "with_xids", "within_s")}
        xid, with_xids = raw.get("xid"), raw.get("with_xids")
        if (
            not isinstance(xid, int)
            or not isinstance(with_xids, list)
            or not with_xids
            or not all(isinstance(x, int) for x in with_xids)
        ):
            raise PolicyError(f"{where}: needs xid = N and with_xids = [M, ...] (numbers)")
        within = raw.get("within_s", 60.0)
        if not isinstance(within, int | float) or within <= 0:
            raise PolicyError(f"{where}: within_s = {within!r} must be a number > 0")
        wf = XidWorkflow(xid, frozenset(with_xids), float(within), _entry(where, rest, None, None))
        policy.workflows = [w for w in policy.workflows if (w.xid, w.with_xids) != (xid, wf.with_xids)]
        policy.workflows.append(wf)


def _apply_rules(policy: Policy, table: dict[str, Any], source: str) -> None:
    for name, raw in table.items():
        if name not in rule_names():
            raise PolicyError(f"{source}: [rules.{name}] is not a rule; rules: {', '.join(rule_names())}")
        entry = _entry(f"{source}: [rules.{name}]", raw, policy.rules.get(name), None)
        limit = rule_threshold_limits().get(name)
        if limit is not None and entry.threshold >= limit:
            raise PolicyError(
                f"{source}: [rules.{name}] threshold = {entry.threshold:g} must be under {limit:g} "
                "(it is a fraction: 0.1 = 10 %)"
            )
        policy.rules[name] = entry


def load_policy(override: str | Path | None = None) -> Policy:
    """The shipped defaults, then the override file (if any) on top."""
    policy = Policy(buckets={}, xids={}, workflows=[], rules={})
    _apply(policy, tomllib.loads(_default_text()), "default_policy.toml")
    missing = [b for b in set(xid_catalog.BUCKET.values()) if b not in policy.buckets]
    missing += [r for r in rule_names() if r not in policy.rules]
    if missing:
        raise PolicyError(f"default_policy.toml: no entry for {', '.join(sorted(missing))}")
    policy.sources = ("default_policy.toml",)
    if override:
        _apply(policy, _read(override), str(override))
        policy.sources += (str(override),)
    return policy


def load_policy_text(text: str, source: str) -> Policy:
    """The shipped defaults with an override given as text (named source in errors)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"policy {source} is not valid TOML: {exc}") from exc
    policy = load_policy()
    _apply(policy, data, source)
    policy.sources += (source,)
    return policy


def check_policy_file(path: str | Path) -> Policy:
    """Validate an override file against the defaults; raises PolicyError naming the problem."""
    return load_policy(path)
