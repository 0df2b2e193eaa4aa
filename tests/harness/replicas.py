"""Replicas of the aggregator for a test: started on a shared PostgreSQL control plane with a
short lease, and the Fleet API calls the replica tests make."""

from __future__ import annotations

from typing import Any

import grpc

from gpufleet.protos import fleet_pb2, fleet_pb2_grpc
from harness.processes import AggregatorHandle, Cluster
from harness.repair import FAST_POLICY, repair_flags

LEASE_S = 3.0
SLOW_VALIDATION = FAST_POLICY.replace("validate_s = 2.0", "validate_s = 12.0")
ECC_FAULT = '[[fault]]\nat_s = 2.0\ngpu = 5\nkind = "ecc_uncorrected"\nnode = "{node}"\n'


def replica(
    cluster: Cluster, name: str, pg_url: str, influx: tuple[str, ...], *extra: str
) -> AggregatorHandle:
    policy = cluster.tmp / "policy.toml"
    policy.write_text(SLOW_VALIDATION)
    return cluster.aggregator(
        name,
        0,
        0,
        cluster.tmp / name,
        *influx,
        "--control-plane",
        pg_url,
        "--replica-id",
        name,
        "--leader-lease-s",
        str(LEASE_S),
        "--live-sync-s",
        "0.3",
        # Several replicas (and PostgreSQL, influxd, collectors) share this machine's two cores:
        # each replica ingests in its main process, leaving the CPU to what these tests check
        # (tests/ingest/test_ingest_workers.py has the worker processes).
        "--ingest-workers",
        "0",
        *repair_flags(policy),
        *extra,
    )


class Fleet:
    """Fleet API calls with the viewer or operator token."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def call(self, agg: AggregatorHandle, method: str, request: Any, token: str = "viewer") -> Any:
        with grpc.insecure_channel(agg.fleet) as channel:
            stub = fleet_pb2_grpc.FleetStub(channel)
            return getattr(stub, method)(
                request,
                metadata=self.cluster.secrets.metadata(token),
                timeout=10,
            )

    def status(self, agg: AggregatorHandle) -> Any:
        return self.call(agg, "GetStatus", fleet_pb2.StatusRequest())

    def leader(self, aggs: list[AggregatorHandle]) -> AggregatorHandle | None:
        """The one replica that says it leads (None while none does, or if two said so)."""
        leading = [a for a in aggs if a.proc.alive() and self.status(a).repair_leader]
        return leading[0] if len(leading) == 1 else None
