"""The shared vocabulary's user-facing names: each enum value of vocabulary.proto as logs, the
CLI, the dashboard and alerts spell it (prefix dropped; states and severities lower case,
actions as NVIDIA's XID catalog spells its buckets)."""

from __future__ import annotations

from gpufleet.protos import vocabulary_pb2


def action_name(value: int) -> str:
    return vocabulary_pb2.Action.Name(value).removeprefix("ACTION_")


def action_value(name: str) -> int:
    return vocabulary_pb2.Action.Value(f"ACTION_{name}")


def health_name(value: int) -> str:
    return vocabulary_pb2.NodeHealth.Name(value).removeprefix("NODE_HEALTH_").lower()


def health_value(state: str) -> int:
    return vocabulary_pb2.NodeHealth.Value(f"NODE_HEALTH_{state.upper()}")


def severity_name(value: int) -> str:
    return vocabulary_pb2.Severity.Name(value).removeprefix("SEVERITY_").lower()


def liveness_name(value: int) -> str:
    return vocabulary_pb2.Liveness.Name(value).removeprefix("LIVENESS_").lower()


ACTIONS = [v.name.removeprefix("ACTION_") for v in vocabulary_pb2.Action.DESCRIPTOR.values][1:]
HEALTH_STATES = [
    v.name.removeprefix("NODE_HEALTH_").lower() for v in vocabulary_pb2.NodeHealth.DESCRIPTOR.values
][1:]
