"""How ingest refuses: every refusal of a stream, a report or a command result is counted by
reason and logged with the node; dropped unknown protobuf fields are counted and logged once a
minute a node."""

from __future__ import annotations

import logging

import grpc

from gpufleet.aggregator.ingest.session import End, OncePer, Received
from gpufleet.aggregator.metrics import AggregatorMetrics

log = logging.getLogger("gpufleet.aggregator.ingest.service")


class Refusals:
    def __init__(self, metrics: AggregatorMetrics) -> None:
        self._metrics = metrics
        self._unknown_logged = OncePer(60.0)

    def refuse(self, reason: str, code: grpc.StatusCode, message: str, node: str = "") -> End:
        """A stream ended: counted and logged; the End its handler sends."""
        self._metrics.reject(reason, code.name)
        log.warning(
            "refused collector stream: %s", message, extra={"node": node, "reason": reason, "code": code.name}
        )
        return End(code, message)

    def note_unknown(self, node: str, received: Received) -> None:
        """Bytes of fields the schema does not name were dropped: counted, logged once a minute
        a node (a newer collector, or one probing what the aggregator keeps)."""
        if not received.unknown_bytes:
            return
        self._metrics.unknown_fields_dropped.inc()
        self._metrics.unknown_bytes_dropped.inc(received.unknown_bytes)
        if self._unknown_logged.due(node):
            log.warning(
                "dropped %d bytes of fields the schema does not name from a %s (a newer collector "
                "than this aggregator, or a crafted message); the rest is taken; logged once a minute",
                received.unknown_bytes,
                received.message.WhichOneof("body") or "message",
                extra={"node": node},
            )
