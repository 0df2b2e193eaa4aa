"""The aggregator's settings, by area: serving (addresses, TLS, who may connect), ingest (what one
node may cost), the history store, repair (policy, rails, backends, alerts), replicas. Each area
is a dataclass with its own checks; aggregator/config.py puts them together. Layering (file,
environment, flags) is done by the CLI from each field's metadata."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def setting(default: Any, help_text: str) -> Any:
    """A setting: its default and its help (the CLI layers file, environment and flags from these)."""
    return field(default=default, metadata={"help": help_text})


def require(ok: bool, message: str) -> None:
    """A setting's check: ValueError with the message (naming the setting, its value, the rule)."""
    if not ok:
        raise ValueError(message)
