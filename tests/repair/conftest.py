"""The repair area's fixtures: a Kubernetes API stand-in and alert receivers, each closed after
the test even when it fails (the real Slurm, shared with other areas, is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.alert_receiver import AlertReceiver
from harness.k8s_standin import KubeStandin


@pytest.fixture
def kube() -> Iterator[KubeStandin]:
    """A Kubernetes API server stand-in (tests/harness/k8s_standin.py) on loopback."""
    standin = KubeStandin()
    try:
        yield standin
    finally:
        standin.close()


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
