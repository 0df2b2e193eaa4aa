"""How big a Fleet API answer may be, and what one node may put on it (docs/security.md "One
node's share of an answer"). A client takes CLIENT_RECEIVE_BYTES (gRPC's default); a listed
answer stops adding entries at ANSWER_BYTES; one node's entry on a ListNodes page is at most
NODE_SUMMARY_BYTES and its GetNode at most NODE_DETAIL_BYTES, whatever it sends: what does not
fit is left out in a fixed order, and the entry says how many bytes were (clipped_bytes), so a
person reading it knows the rest is on GetNode (or, for GetNode, in the store)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet.protos import fleet_pb2

CLIENT_RECEIVE_BYTES = 4 << 20
ANSWER_BYTES = 3 << 20  # with the answer's own fields, well under what a client takes
NODE_SUMMARY_BYTES = 64 << 10  # an honest 64-GPU node with 8 engines, every metric set: 24,839 bytes
NODE_DETAIL_BYTES = 512 << 10  # that node's summary, its processes and 100 events: far under
# An engine's free text (endpoint, why it is unreadable) on a clipped entry: enough to read.
ENGINE_TEXT_KEPT = 256
_CLIPPED_FIELD_BYTES = 7  # a clipped_bytes field: a tag of up to 2 bytes, a uint32 of up to 5


def framed_bytes(msg: Any) -> int:
    """A message's bytes as an entry of a repeated field: itself, a tag byte and a length of up
    to 5 bytes."""
    return int(msg.ByteSize()) + 6


class AnswerBytes:
    """Entries of one answer, counted against a cap: `fits` says whether one more goes on (and
    counts it if so)."""

    def __init__(self, cap: int = ANSWER_BYTES) -> None:
        self.cap = cap
        self.used = 0

    def fits(self, msg: Any) -> bool:
        size = framed_bytes(msg)
        if self.used + size > self.cap:
            return False
        self.used += size
        return True


def _clip_engine_text(engines: Any) -> None:
    for engine in engines:
        engine.endpoint = engine.endpoint[:ENGINE_TEXT_KEPT]
        engine.unreadable_reason = engine.unreadable_reason[:ENGINE_TEXT_KEPT]


def _drop(repeated: Any, first: bool = False) -> Callable[[], bool]:
    """A step that drops one entry of a repeated field (its last, or its first)."""

    def drop() -> bool:
        if not len(repeated):
            return False
        del repeated[0 if first else -1]
        return True

    return drop


def _shed(msg: Any, cap: int, steps: list[Callable[[], Any]]) -> int:
    """Run each step while msg is over cap, less the room its clipped_bytes field takes (a step
    returning True is run again: it drops one entry at a time); the bytes left out."""
    before, room = msg.ByteSize(), cap - _CLIPPED_FIELD_BYTES
    for step in steps:
        while msg.ByteSize() > room and step() is True:
            pass
    return int(before - msg.ByteSize())


def _gpu_steps(summary: fleet_pb2.NodeSummary) -> list[Callable[[], Any]]:
    def drop_last_gpu() -> bool:
        if not summary.gpus:
            return False
        index = summary.gpus.pop().index
        kept = [s for s in summary.gpu_states if s.index != index]
        del summary.gpu_states[:]
        summary.gpu_states.extend(kept)
        return True

    return [lambda: [gpu.ClearField("processes") for gpu in summary.gpus], drop_last_gpu]


def clip_summary(summary: fleet_pb2.NodeSummary, cap: int = NODE_SUMMARY_BYTES) -> fleet_pb2.NodeSummary:
    """The node's entry on a ListNodes page, at most cap bytes. What leaves first: its GPUs'
    process lists (GetNode has them), its engines' long free text, its engines from the last,
    then its GPUs from the last."""
    if summary.ByteSize() > cap:
        process_lists, gpus = _gpu_steps(summary)
        steps = [process_lists, lambda: _clip_engine_text(summary.engines), _drop(summary.engines), gpus]
        summary.clipped_bytes = _shed(summary, cap, steps)
    return summary


def clip_detail(detail: fleet_pb2.NodeDetail, cap: int = NODE_DETAIL_BYTES) -> fleet_pb2.NodeDetail:
    """A node's GetNode answer, at most cap bytes. What leaves first: the summary's copy of the
    engines (detail.engines has them), the oldest recent events, the engines' long free text,
    the engines from the last, then the GPUs' process lists and the GPUs from the last."""
    if detail.ByteSize() > cap:
        steps = [
            lambda: detail.summary.ClearField("engines"),
            _drop(detail.recent_events, first=True),
            lambda: _clip_engine_text(detail.engines),
            _drop(detail.engines),
            *_gpu_steps(detail.summary),
        ]
        detail.clipped_bytes = _shed(detail, cap, steps)
    return detail
