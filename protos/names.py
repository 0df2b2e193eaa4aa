"""The shared vocabulary's user-facing names: each enum value of vocabulary.proto as logs, the
CLI, the dashboard and alerts spell it (prefix dropped; states and severities lower case,
actions as NVIDIA's XID catalog spells its buckets)."""

from __future__ import annotations

import re

from gpufleet.protos import fleet_pb2, vocabulary_pb2

# What a collector reports as the engine and model of an inference endpoint it has never read
# (collector/sources/engines/scrape.py): such a replica is in no serving pool (repair/serving.py).
UNKNOWN_ENGINE_MODEL = "unknown"

# The serving names' one grammar (docs/security.md "Serving pools and the capacity guard"),
# checked by the collector's settings and again by the aggregator on every replica a node
# reports, and by the policy for the pools it declares. A pool name is a Kubernetes label
# value's form (what an InferencePool or a Deployment is named by), so it reads the same in a
# label, a Prometheus label and a table. A model name is what engines serve models as: a
# Hugging Face id ("meta-llama/Llama-3.1-70B-Instruct") or a path ("/models/llama"), nothing
# that Markdown, Slack or a shell reads as more than text (no space, '<', '>', '*', '[', '|'...).
POOL_NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
POOL_NAME_RULE = "1 to 63 letters, digits, '.', '_' or '-', starting and ending with a letter or digit"
MODEL_NAME_RE = re.compile(r"[A-Za-z0-9/][A-Za-z0-9._:/@+-]{0,127}")
MODEL_NAME_RULE = (
    "1 to 128 letters, digits, '.', '_', ':', '/', '@', '+' or '-', starting with a letter, digit or '/'"
)


def serving_name_problem(kind: str, name: str) -> str:
    """Why `name` is not a usable pool (kind "pool") or model (kind "model") name; "" when it is."""
    pattern, rule = (POOL_NAME_RE, POOL_NAME_RULE) if kind == "pool" else (MODEL_NAME_RE, MODEL_NAME_RULE)
    if pattern.fullmatch(name):
        return ""
    return f"{kind} name {name[:80]!r}{'...' if len(name) > 80 else ''} is not {rule}"


# A workload's names (docs/workloads.md): the schedulers a node may name, and one grammar for the
# ids and parts it reports (a Slurm job id and step, a Kubernetes namespace/pod and container, a
# site's id): nothing a shell, a path, a URL or Markdown reads as more than text.
WORKLOAD_SCHEDULERS = ("slurm", "kubernetes", "site", "none")
WORKLOAD_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+/-]{0,126}")
WORKLOAD_ID_RULE = (
    "1 to 127 letters, digits, '.', '_', ':', '@', '+', '/' or '-', starting with a letter or digit"
)


def workload_problem(scheduler: str, workload_id: str, part: str = "") -> str:
    """Why a reported workload's names are unusable; "" when they are."""
    if scheduler not in WORKLOAD_SCHEDULERS:
        return f"scheduler {scheduler[:40]!r} is none of {', '.join(WORKLOAD_SCHEDULERS)}"
    if scheduler == "none":
        return "" if not workload_id and not part else "a process of no workload names no id"
    for what, value in (("id", workload_id), ("part", part)):
        if not value and what == "part":
            continue
        if not WORKLOAD_ID_RE.fullmatch(value) or ".." in value:
            shown = f"{value[:80]!r}{'...' if len(value) > 80 else ''}"
            return f"workload {what} {shown} is not {WORKLOAD_ID_RULE} (nor holds '..')"
    if scheduler == "slurm" and not workload_id.isdigit():
        return f"Slurm job id {workload_id[:40]!r} is not a number"
    return ""


def action_name(value: int) -> str:
    return vocabulary_pb2.Action.Name(value).removeprefix("ACTION_")


def action_value(name: str) -> int:
    return vocabulary_pb2.Action.Value(f"ACTION_{name}")


def health_name(value: int) -> str:
    return vocabulary_pb2.NodeHealth.Name(value).removeprefix("NODE_HEALTH_").lower()


def gpu_health_name(value: int) -> str:
    """ok, watch, suspect, faulty, lost (repair/gpu_health.py); "" when not given."""
    return vocabulary_pb2.GpuHealth.Name(value).removeprefix("GPU_HEALTH_").lower() if value else ""


def health_value(state: str) -> int:
    return vocabulary_pb2.NodeHealth.Value(f"NODE_HEALTH_{state.upper()}")


def severity_name(value: int) -> str:
    return vocabulary_pb2.Severity.Name(value).removeprefix("SEVERITY_").lower()


def liveness_name(value: int) -> str:
    return vocabulary_pb2.Liveness.Name(value).removeprefix("LIVENESS_").lower()


def event_kind_name(value: int) -> str:
    """As the store's `kind` tag spells it: xid, gpu_lost, ..."""
    return vocabulary_pb2.EventKind.Name(value).removeprefix("EVENT_KIND_").lower()


def event_source_name(value: int) -> str:
    """As the store's `source` tag and the logs spell it: nvml, kmsg, collector."""
    return vocabulary_pb2.EventSource.Name(value).removeprefix("EVENT_SOURCE_").lower()


# The other way: a stored tag back to its enum value (a policy replay reads events back).
EVENT_KINDS = {event_kind_name(v): v for v in vocabulary_pb2.EventKind.values()}
EVENT_SOURCES = {event_source_name(v): v for v in vocabulary_pb2.EventSource.values()}

# What history's events are (the Fleet API's QueryEvents kinds): the collector's event kinds, then
# the repair controller's health findings and repair actions (aggregator/fleet/events.py).
HISTORY_EVENT_KINDS = (*(k for k in EVENT_KINDS if k != "unspecified"), "health", "repair")


def outcome_status_name(value: int) -> str:
    """As the audit log spells an outcome's status: ok, failed, dry-run, ..."""
    return vocabulary_pb2.OutcomeStatus.Name(value).removeprefix("OUTCOME_STATUS_").lower().replace("_", "-")


OUTCOME_STATUSES = {outcome_status_name(v): v for v in vocabulary_pb2.OutcomeStatus.values() if v}

ACTIONS = [v.name.removeprefix("ACTION_") for v in vocabulary_pb2.Action.DESCRIPTOR.values][1:]
# What a node reads as before any report of it was accepted (never a workflow state).
NO_DATA_HEALTH = "no_data"
# The repair workflow's states (repair/health.py Health holds the same words).
HEALTH_STATES = [
    name
    for v in vocabulary_pb2.NodeHealth.DESCRIPTOR.values[1:]
    if (name := v.name.removeprefix("NODE_HEALTH_").lower()) != NO_DATA_HEALTH
]
# The node states that mean "out of service" (cordoned by automation or by a person): defined
# here once, for the repair workflow (repair/health.py) and every front end alike.
OUT_OF_SERVICE_STATES = frozenset(
    {"cordoned", "draining", "repairing", "validating", "quarantined", "human_cordoned"}
)


def aggregate_name(value: int) -> str:
    """A history aggregate as the CLI, the dashboard and the stores spell it (unspecified: mean)."""
    if value == fleet_pb2.AGGREGATE_UNSPECIFIED:
        return "mean"
    return fleet_pb2.Aggregate.Name(value).removeprefix("AGGREGATE_").lower()


# The one list of history aggregates: name -> the Fleet API's value.
AGGREGATES = {aggregate_name(v): v for v in fleet_pb2.Aggregate.values() if v}

# Every liveness but "unspecified", by value: what `gpufleet_fleet_nodes{liveness}` counts.
LIVENESS_NAMES = {v: liveness_name(v) for v in vocabulary_pb2.Liveness.values() if v}

# How a drain held by the capacity guard says what it waits for (repair/capacity.py): the node's
# detail starts with this in RepairStatus, and the dashboard lists those nodes by it.
CAPACITY_WAIT_PREFIX = "waiting for capacity: "
