"""A setting as a dataclass field (its default and help) and a setting's check: what every
settings dataclass uses, the aggregator's areas (aggregator/settings/) and the plug-ins' own
(common/registry.py). The CLI layers the file, the environment and flags from each field's
metadata."""

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
