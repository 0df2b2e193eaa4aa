"""The Fleet API: the only way the dashboard and the CLI see the fleet. One servicer made of its
RPC groups (nodes.py, history.py, repair.py, workloads.py), each an object given what it uses: the gate every
call goes through (base.py: authentication, role, counting, refusals, forwarding to the repair
leader) and, for nodes and repair, one view of repair (repair_view.py). The servicer serves each
RPC by its group's method; a .proto RPC no group serves, or two serve, stops the start."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpufleet.aggregator.api.base import RpcGate, served_rpcs
from gpufleet.aggregator.api.history import HistoryApi
from gpufleet.aggregator.api.leader import LeaderForwarding
from gpufleet.aggregator.api.nodes import NodesApi
from gpufleet.aggregator.api.repair import RepairApi
from gpufleet.aggregator.api.repair_view import RepairView
from gpufleet.aggregator.api.workloads import WorkloadsApi
from gpufleet.aggregator.auth.tokens import Authenticator
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.store import Store
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc
from gpufleet.repair.state import Workflow

if TYPE_CHECKING:
    from gpufleet.aggregator.repair_wiring import RepairWiring
    from gpufleet.aggregator.replication.control_plane import ControlPlane
    from gpufleet.aggregator.workloads.wiring import Workloads

GROUPS = (NodesApi, HistoryApi, RepairApi, WorkloadsApi)
FLEET_RPCS = tuple(m.name for m in fleet_pb2.DESCRIPTOR.services_by_name["Fleet"].methods)


def rpcs_by_group() -> dict[str, type]:
    """Which group serves each Fleet RPC; an RPC served by none or by two is refused here."""
    served: dict[str, type] = {}
    for group in GROUPS:
        for name in served_rpcs(group):
            if name in served:
                raise TypeError(f"Fleet RPC {name} is served by {served[name].__name__} and {group.__name__}")
            served[name] = group
    missing = [name for name in FLEET_RPCS if name not in served]
    unknown = [name for name in served if name not in FLEET_RPCS]
    if missing or unknown:
        raise TypeError(f"Fleet RPCs no group serves: {missing}; served but not in fleet.proto: {unknown}")
    return served


class FleetService(fleet_pb2_grpc.FleetServicer):
    def __init__(
        self,
        auth: Authenticator,
        fleet: FleetState,
        store: Store,
        metrics: AggregatorMetrics,
        status: Callable[[], fleet_pb2.AggregatorStatus] | None = None,
        repair: RepairWiring | None = None,
        shared: ControlPlane | None = None,
        workloads: Workloads | None = None,
        show_user_names: bool = False,
    ) -> None:
        rpcs_by_group()
        gate = RpcGate(auth, metrics, LeaderForwarding(repair, shared))
        self.repair_view = RepairView(repair, shared)
        groups = (
            NodesApi(gate, fleet, self.repair_view, status or fleet_pb2.AggregatorStatus),
            HistoryApi(gate, store),
            RepairApi(gate, self.repair_view, store, show_user_names),
            WorkloadsApi(gate, workloads, show_user_names, self.repair_view),
        )
        for group in groups:
            # What grpc's add_FleetServicer_to_server registers: each RPC's name on this object.
            for name, method in served_rpcs(group).items():
                setattr(self, name, method)

    def workflows(self) -> dict[str, Workflow]:
        """Every node's repair workflow as this replica knows it now."""
        return self.repair_view.workflows()
