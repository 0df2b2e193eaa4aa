"""The workflow state names (NodeHealth in protos/vocabulary.proto, lower case, prefix dropped)."""

from __future__ import annotations

from gpufleet.protos import vocabulary_pb2

STATES = [v.name.removeprefix("NODE_HEALTH_").lower() for v in vocabulary_pb2.NodeHealth.DESCRIPTOR.values][
    1:
]


def health_value(state: str) -> int:
    return vocabulary_pb2.NodeHealth.Value(f"NODE_HEALTH_{state.upper()}")
