"""Simulated time for the stand-in GPUs."""

from __future__ import annotations


class FakeClock:
    """Simulated time for the simulated GPUs (the stand-in advances to the clock it is given)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
