"""The generated code in protos/ must be exactly what the .proto files produce."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.client.fleet import FleetClient
from gpufleet.client.rpcs import FleetRpc, every_rpc
from gpufleet.protos import fleet_pb2
from harness.paths import REPO

SCRIPT = REPO / "scripts" / "gen_protos.py"


def _check(protos_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--protos-dir", str(protos_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_committed_generated_code_matches_the_proto_files() -> None:
    result = _check(REPO / "protos")
    assert result.returncode == 0, result.stderr


def test_check_fails_when_a_proto_changes_without_regenerating(tmp_path: Path) -> None:
    copy = tmp_path / "protos"
    shutil.copytree(REPO / "protos", copy, ignore=shutil.ignore_patterns("__pycache__"))
    proto = copy / "telemetry.proto"
    proto.write_text(
        proto.read_text().replace(
            "optional double power_limit_w = 33;",
            "optional double power_limit_w = 33;\n  optional double fan_speed_pct = 34;",
        )
    )
    result = _check(copy)
    assert result.returncode == 1
    assert "telemetry_pb2" in result.stderr and "gen_protos.py" in result.stderr


def test_every_fleet_rpc_is_served_by_our_code_not_the_generated_placeholder() -> None:
    """protoc's FleetServicer answers every method with NotImplementedError (generated code,
    kept as generated); each RPC the .proto declares is served by exactly one of FleetService's
    groups, and a group that served none, or two serving one, stops the service's start."""
    from gpufleet.aggregator.api import service
    from gpufleet.aggregator.api.base import rpc
    from gpufleet.protos import fleet_pb2_grpc

    methods = [m.name for m in fleet_pb2.DESCRIPTOR.services_by_name["Fleet"].methods]
    # the first waves' twelve, ReplayPolicy, QueryEvents, RevokeCollectorToken, Proceed, ListPools
    assert len(methods) == 20
    served = service.rpcs_by_group()
    assert set(served) == set(methods)
    for name, group in served.items():
        assert getattr(group, name) is not getattr(fleet_pb2_grpc.FleetServicer, name, None)

    class Twice:
        @rpc("viewer")
        async def GetNode(self, request: object, principal: object) -> None: ...

    class Lacking:
        pass

    original = service.GROUPS
    try:
        service.GROUPS = (*original, Twice)  # type: ignore[assignment]
        with pytest.raises(TypeError, match="GetNode is served by NodesApi and Twice"):
            service.rpcs_by_group()
        service.GROUPS = (Lacking, *original[1:])  # type: ignore[assignment]
        with pytest.raises(TypeError, match=r"no group serves: .*GetNode"):
            service.rpcs_by_group()
    finally:
        service.GROUPS = original


def test_the_clients_typed_rpcs_are_the_fleet_service() -> None:
    """client/rpcs.py names every Fleet RPC with the request and answer types fleet.proto gives it,
    and the client refuses a request of the wrong type before sending it."""
    service = fleet_pb2.DESCRIPTOR.services_by_name["Fleet"]
    declared = {m.name: (m.input_type.full_name, m.output_type.full_name) for m in service.methods}
    typed = {r.name: (r.request.DESCRIPTOR.full_name, r.response.DESCRIPTOR.full_name) for r in every_rpc()}
    assert typed == declared
    client = FleetClient.__new__(FleetClient)  # no channel: the type is checked before any is used
    with pytest.raises(TypeError, match="GetNode takes a GetNodeRequest, not a StatusRequest"):
        client.call(FleetRpc.GetNode, fleet_pb2.StatusRequest())  # type: ignore[arg-type]
