"""The Fleet API: the only way the dashboard and the CLI see the fleet. One servicer made of its
RPC groups (nodes.py, history.py, repair.py), each a mixin over the state set up here; every
call goes through base.py's `rpc` (authentication, role, counting, refusals)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from gpufleet.aggregator.api.base import Refused
from gpufleet.aggregator.api.history import HistoryApi
from gpufleet.aggregator.api.nodes import NodesApi
from gpufleet.aggregator.api.repair import RepairApi
from gpufleet.aggregator.auth.tokens import Authenticator, AuthError, Principal, bearer
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.store import Store
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc

if TYPE_CHECKING:
    from gpufleet.aggregator.repair_wiring import RepairWiring
    from gpufleet.aggregator.replication.control_plane import ControlPlane


class FleetService(NodesApi, HistoryApi, RepairApi, fleet_pb2_grpc.FleetServicer):
    def __init__(
        self,
        auth: Authenticator,
        fleet: FleetState,
        store: Store,
        metrics: AggregatorMetrics,
        status: Callable[[], fleet_pb2.AggregatorStatus] | None = None,
        repair: RepairWiring | None = None,
        shared: ControlPlane | None = None,
    ) -> None:
        self._wiring = repair
        self._shared = shared
        self._auth = auth
        self._fleet = fleet
        self._store = store
        self._metrics = metrics
        self._status = status or fleet_pb2.AggregatorStatus
        self._replay_lock = asyncio.Lock()
        self._lemon_counts: tuple[dict[str, int], int] = ({}, 0)
        self._lemon_read_at = -1e9
        self._lemon_counting: asyncio.Future[None] | None = None  # the replicas' count in flight
        # Replicas serve with TLS when configured: the leader is dialled trusting the same
        # certificate (one certificate for every replica, or a chain its file completes).
        self._tls_ca: bytes | None = None
        if shared is not None and shared.tls_cert:
            self._tls_ca = Path(shared.tls_cert).read_bytes()

    def _authorize(self, context: grpc.aio.ServicerContext, role: str) -> Principal:
        try:
            principal = self._auth.check_fleet(bearer(context.invocation_metadata()))
        except AuthError as exc:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, str(exc)) from exc
        if not principal.has_role(role):
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"token {principal.name!r} has role {principal.role}; this needs {role}",
            )
        return principal
