"""One time format for people, the same on every surface (the CLI, the dashboard's tables, alert
summaries, replay reports): UTC, ISO 8601 to the second, with a Z."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(ns: int) -> str:
    """Nanoseconds since 1970 as `2026-12-07T08:00:00Z`."""
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
