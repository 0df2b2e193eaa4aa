"""The Fleet API's calls, typed: each names its RPC with its request and answer types, so a
caller's `client.call(FleetRpc.GetNode, request)` is a `NodeDetail` to the type checker and a
request of the wrong type is refused before it is sent. tests/project/test_protos.py holds this
table equal to the Fleet service in fleet.proto."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf.message import Message

from gpufleet.protos import fleet_pb2

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


@dataclass(frozen=True)
class Rpc(Generic[Req, Resp]):
    name: str  # the method of the Fleet service
    request: type[Req]
    response: type[Resp]


class FleetRpc:
    """Every RPC of the Fleet service (protos/fleet.proto)."""

    WhoAmI = Rpc("WhoAmI", fleet_pb2.WhoAmIRequest, fleet_pb2.WhoAmIResponse)
    ListNodes = Rpc("ListNodes", fleet_pb2.ListNodesRequest, fleet_pb2.ListNodesResponse)
    GetNode = Rpc("GetNode", fleet_pb2.GetNodeRequest, fleet_pb2.NodeDetail)
    ListMetrics = Rpc("ListMetrics", fleet_pb2.ListMetricsRequest, fleet_pb2.ListMetricsResponse)
    QueryHistory = Rpc("QueryHistory", fleet_pb2.HistoryRequest, fleet_pb2.HistoryResponse)
    QueryEvents = Rpc("QueryEvents", fleet_pb2.EventsRequest, fleet_pb2.EventsResponse)
    GetStatus = Rpc("GetStatus", fleet_pb2.StatusRequest, fleet_pb2.AggregatorStatus)
    ListIncidents = Rpc("ListIncidents", fleet_pb2.ListIncidentsRequest, fleet_pb2.ListIncidentsResponse)
    ListAudit = Rpc("ListAudit", fleet_pb2.ListAuditRequest, fleet_pb2.ListAuditResponse)
    GetRepairStatus = Rpc("GetRepairStatus", fleet_pb2.RepairStatusRequest, fleet_pb2.RepairStatus)
    Cordon = Rpc("Cordon", fleet_pb2.CordonRequest, fleet_pb2.CordonResponse)
    Uncordon = Rpc("Uncordon", fleet_pb2.CordonRequest, fleet_pb2.CordonResponse)
    ResetBreaker = Rpc("ResetBreaker", fleet_pb2.ResetBreakerRequest, fleet_pb2.RepairStatus)
    Proceed = Rpc("Proceed", fleet_pb2.CordonRequest, fleet_pb2.CordonResponse)
    ListPools = Rpc("ListPools", fleet_pb2.ListPoolsRequest, fleet_pb2.ListPoolsResponse)
    ReplayPolicy = Rpc("ReplayPolicy", fleet_pb2.ReplayRequest, fleet_pb2.ReplayResponse)
    RevokeCollectorToken = Rpc(
        "RevokeCollectorToken", fleet_pb2.RevokeTokenRequest, fleet_pb2.RevokeTokenResponse
    )
    ListWorkloads = Rpc("ListWorkloads", fleet_pb2.ListWorkloadsRequest, fleet_pb2.ListWorkloadsResponse)
    GetWorkload = Rpc("GetWorkload", fleet_pb2.GetWorkloadRequest, fleet_pb2.WorkloadDetail)
    QueryUsage = Rpc("QueryUsage", fleet_pb2.UsageRequest, fleet_pb2.UsageResponse)


def every_rpc() -> list[Rpc[Message, Message]]:
    return [value for value in vars(FleetRpc).values() if isinstance(value, Rpc)]
