"""`gpufleet config check FILE` on the project's other TOML files: a repair policy override
(examples/policy-*.toml) or a demo fault scenario (examples/*.toml with [[fault]]) is named as
what it is and checked by its own loader (the one `gpufleet policy check` and `gpufleet demo
--scenario` use), instead of failing as a settings file with "unknown section"."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# Node names a scenario may mention are checked against a demo this large (the demo's --nodes).
SCENARIO_NODES_CHECKED = 64


def _policy(path: str) -> str:
    from gpufleet.repair.policy import check_policy_file

    policy = check_policy_file(path)
    return (
        f"{len(policy.xids)} XID override(s), {len(policy.workflows)} multi-XID workflow(s), "
        f"{len(policy.rules)} rules; `gpufleet policy check FILE` checks it the same way, "
        "`gpufleet replay --compare FILE` shows what it would change"
    )


def _scenario(path: str) -> str:
    from gpufleet.cli.demo import demo_nodes
    from gpufleet.cli.demo_serving import load_plan
    from gpufleet.collector.simnvml.scenario import load

    faults = load(path)
    plan = load_plan(path, demo_nodes(SCENARIO_NODES_CHECKED))
    pool = ", a serving pool" if plan else ""
    return f"{len(faults)} fault(s){pool}; run it with `gpufleet demo --scenario FILE`"


def _kind(
    data: Mapping[str, Any], settings_sections: Mapping[str, type]
) -> tuple[str, Callable[[str], str]] | None:
    from gpufleet.repair.policy import POLICY_TABLES

    if not data or set(data) & set(settings_sections):
        return None
    if "fault" in data:
        return "a demo fault scenario", _scenario
    if set(data) <= POLICY_TABLES:
        return "a repair policy override", _policy
    return None


def check_other_kind(path: str, settings_sections: Mapping[str, type], as_json: bool = False) -> int | None:
    """The exit code of checking path as what it is, when it is a policy or a scenario (None: a
    settings file, or not readable: the settings check says why)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    kind = _kind(data, settings_sections)
    if kind is None:
        return None
    name, check = kind
    try:
        summary, problem = check(path), ""
    except ValueError as exc:  # PolicyError, ScenarioError, ServingScenarioError
        summary, problem = "", str(exc)
    if as_json:
        print(json.dumps({"file": path, "kind": name, "ok": not problem, "problem": problem or None}))
    else:
        print(f"{path} is {name}, not a settings file: checked as one.")
        print(f"{path}: {'valid: ' + summary if not problem else 'NOT valid: ' + problem}")
    return 2 if problem else 0
