"""The repair area's fixtures: alert receivers, each closed after the test even when it fails
(the Kubernetes API stand-in and the real Slurm, shared with other areas, are in
tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.alert_receiver import AlertReceiver


@pytest.fixture
def alert_receiver() -> Iterator[Callable[..., AlertReceiver]]:
    """Makes real HTTP alert receivers (AlertReceiver's arguments: fail_first, port)."""
    made: list[AlertReceiver] = []

    def make(**kwargs: Any) -> AlertReceiver:
        receiver = AlertReceiver(**kwargs)
        made.append(receiver)
        return receiver

    try:
        yield make
    finally:
        for receiver in made:
            receiver.close()
