"""The Fleet API's fleet view: who am I, the nodes (paged), one node, the aggregator's status,
the metrics history knows, and revoking a collector's token."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from gpufleet.aggregator.api.answers import AnswerBytes, clip_detail, clip_summary
from gpufleet.aggregator.api.base import Refused, RpcGate, rpc
from gpufleet.aggregator.api.repair_view import RepairView
from gpufleet.aggregator.auth.tokens import Principal
from gpufleet.aggregator.fleet.pools import if_drained, list_pools
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.ingest.schema import METRICS
from gpufleet.protos import fleet_pb2
from gpufleet.protos.credentials import TOKEN_ID_RE
from gpufleet.repair.state import StateError

log = logging.getLogger("gpufleet.aggregator.fleet")

NODES_PAGE = 500  # ListNodes: nodes a page by default
NODES_PAGE_MAX = 2000  # ... and a page stops at ANSWER_BYTES (aggregator/api/answers.py)


class NodesApi:
    """The fleet view: who am I, the nodes, one node, the serving pools, the aggregator's status,
    the metrics history knows, and revoking a collector's token."""

    def __init__(
        self,
        gate: RpcGate,
        fleet: FleetState,
        view: RepairView,
        status: Callable[[], fleet_pb2.AggregatorStatus],
    ) -> None:
        self._gate = gate
        self._fleet = fleet
        self._view = view
        self._status = status

    @rpc("viewer")
    async def WhoAmI(self, request: fleet_pb2.WhoAmIRequest, principal: Principal) -> Any:
        return fleet_pb2.WhoAmIResponse(name=principal.name, role=principal.role)

    @rpc("viewer")
    async def ListNodes(self, request: fleet_pb2.ListNodesRequest, principal: Principal) -> Any:
        """The fleet a page at a time, in name order (docs/security.md "Bounded per-node
        state", "One node's share of an answer"): at most page_size nodes and ANSWER_BYTES, each
        node's entry at most NODE_SUMMARY_BYTES, so no fleet and no node's reports can make the
        answer bigger than a client takes. A GPU's process list is left out here (GetNode has
        it)."""
        if request.page_size > NODES_PAGE_MAX:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT, f"page_size {request.page_size} is over {NODES_PAGE_MAX}"
            )
        await self._view.count_recent_incidents()  # before the walk: nothing awaits within it
        limit = request.page_size or NODES_PAGE
        now = time.time_ns()
        clusters = set(request.clusters)
        wanted = set(request.liveness)
        nodes: list[fleet_pb2.NodeSummary] = []
        page = AnswerBytes()
        total, next_token = 0, ""
        for name in sorted(self._fleet.nodes):
            live = self._fleet.nodes[name]
            if clusters and live.cluster not in clusters:
                continue
            if wanted and self._fleet.liveness(live, now) not in wanted:
                continue
            total += 1
            if name <= request.page_token or next_token:
                continue
            summary = self._page_entry(live, now) if len(nodes) < limit else None
            if summary is None or not page.fits(summary):
                next_token = nodes[-1].node
                continue
            nodes.append(summary)
        return fleet_pb2.ListNodesResponse(
            nodes=nodes, server_time_unix_ns=now, next_page_token=next_token, total_nodes=total
        )

    def _page_entry(self, live: Any, now_ns: int) -> fleet_pb2.NodeSummary:
        """A node's entry on a ListNodes page: as a viewer sees it, within its share."""
        return clip_summary(self._view.with_health(self._viewer_summary(self._fleet.summary(live, now_ns))))

    @staticmethod
    def _viewer_summary(summary: fleet_pb2.NodeSummary, processes: bool = False) -> fleet_pb2.NodeSummary:
        """What a viewer sees of a node: its collector's boot id only as a digest (the id is
        what a stream of this node presents: docs/security.md "Masking faults")."""
        if summary.boot_id:
            summary.boot_id = "b-" + hashlib.sha256(summary.boot_id.encode()).hexdigest()[:12]
        if not processes:
            for gpu in summary.gpus:
                gpu.ClearField("processes")
        return summary

    @rpc("viewer")
    async def GetNode(self, request: fleet_pb2.GetNodeRequest, principal: Principal) -> Any:
        live = self._fleet.nodes.get(request.node)
        if live is None:
            raise Refused(
                grpc.StatusCode.NOT_FOUND,
                f"node {request.node!r} is not known to this aggregator "
                f"({len(self._fleet.nodes)} nodes are); `gpufleet nodes` lists them",
            )
        detail = self._fleet.detail(live)
        await self._view.count_recent_incidents()
        self._view.with_health(self._viewer_summary(detail.summary, processes=True))
        if live.engines:
            detail.if_drained.extend(
                if_drained(
                    live.node,
                    self._view.serving_readings(),
                    self._view.workflows(),
                    self._view.serving_floor(),
                )
            )
        return clip_detail(detail)

    @rpc("viewer")
    async def ListPools(self, request: fleet_pb2.ListPoolsRequest, principal: Principal) -> Any:
        """The serving pools (aggregator/fleet/pools.py), each from its own replicas' readings."""
        return list_pools(self._view.serving_readings(), self._view.workflows(), self._view.policy(), request)

    @rpc("viewer")
    async def GetStatus(self, request: fleet_pb2.StatusRequest, principal: Principal) -> Any:
        return self._status()

    @rpc("viewer")
    async def ListMetrics(self, request: fleet_pb2.ListMetricsRequest, principal: Principal) -> Any:
        return fleet_pb2.ListMetricsResponse(
            metrics=[
                fleet_pb2.MetricInfo(
                    name=m.name, measurement=m.measurement, unit=m.unit, help=m.help, source=m.source
                )
                for m in METRICS.values()
            ]
        )

    @rpc("operator")
    async def RevokeCollectorToken(self, request: fleet_pb2.RevokeTokenRequest, principal: Principal) -> Any:
        """Put one collector token on the revocation list in the control plane (every replica
        reads it within seconds: aggregator/server.py `revocation_loop`); audited."""
        if not TOKEN_ID_RE.fullmatch(request.token_id):
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"token id {request.token_id[:80]!r} is not one: `gpufleet auth collector-token` prints it",
            )
        if not request.reason.strip():
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "a revocation needs a reason (--reason TEXT)")
        records = self._view.repair_records()
        try:
            added = await asyncio.to_thread(
                records.kept.revoke_collector_token,
                request.token_id,
                request.node,
                principal.name,
                request.reason.strip()[:300],
            )
            revoked = await asyncio.to_thread(records.kept.revoked_collector_tokens)
        except StateError as exc:
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"revocation not recorded: {exc}") from exc
        log.warning(
            "collector token %s revoked by %s: %s",
            request.token_id,
            principal.name,
            request.reason.strip(),
            extra={"node": request.node},
        )
        return fleet_pb2.RevokeTokenResponse(newly_revoked=added, revoked_total=len(revoked))
