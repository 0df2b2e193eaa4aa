"""Commands bound to their node (docs/security.md): what was sent to which collector boot, so
that an answer is taken only from there, once."""

from __future__ import annotations

import time
from dataclasses import dataclass

COMMANDS_PER_NODE = 256  # commands awaiting an answer that one node's book keeps (oldest forgotten)
COMMAND_ANSWER_S = 3600.0  # an answer later than this is refused (the step timed out long ago)


@dataclass
class SentCommand:
    boot_id: str
    sent: float  # monotonic


class CommandBook:
    """The commands sent to each node's collector and not yet answered (docs/security.md
    "Commands bound to their node"): an answer is taken only for a command sent to that node,
    from the same collector boot it was sent to (a later stream of that boot may carry it: a
    result the broken stream did not), and only once. Anything else is refused and counted."""

    def __init__(self) -> None:
        self._sent: dict[str, dict[str, SentCommand]] = {}

    def sent(self, node: str, command_id: str, boot_id: str) -> None:
        book = self._sent.setdefault(node, {})
        book[command_id] = SentCommand(boot_id, time.monotonic())
        while len(book) > COMMANDS_PER_NODE:
            del book[next(iter(book))]

    def answer(self, node: str, command_id: str, boot_id: str) -> str:
        """Why this answer is refused ("" when it is this node's, taken now)."""
        book = self._sent.get(node, {})
        sent = book.get(command_id)
        if sent is None:
            return f"no command {command_id[:80]!r} was sent to node {node!r} (or it was answered already)"
        if sent.boot_id != boot_id:
            return (
                f"command {command_id[:80]!r} was sent to another collector boot of node {node!r}; "
                "a restarted collector cannot answer it"
            )
        del book[command_id]
        if time.monotonic() - sent.sent > COMMAND_ANSWER_S:
            return f"command {command_id[:80]!r} was sent more than {COMMAND_ANSWER_S:g} s ago"
        return ""
