"""A repair call made to a replica that does not lead is answered by the leader: forwarded with
the caller's credentials (every replica shares the secrets file), never in clear to another host,
and never forwarded twice (docs/architecture.md "Control plane and replicas")."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from gpufleet.aggregator.api.base import Refused
from gpufleet.common.net import is_loopback
from gpufleet.protos import fleet_pb2_grpc

if TYPE_CHECKING:
    from gpufleet.aggregator.repair_wiring import RepairWiring
    from gpufleet.aggregator.replication.control_plane import ControlPlane

_FORWARDED = "x-gpufleet-forwarded-by"  # set on a repair call a replica passed to the leader


class LeaderForwarding:
    def __init__(self, wiring: RepairWiring | None, shared: ControlPlane | None) -> None:
        self._wiring = wiring
        self._shared = shared
        # Replicas serve with TLS when configured: the leader is dialled trusting the same
        # certificate (one certificate for every replica, or a chain its file completes).
        self._tls_ca: bytes | None = None
        if shared is not None and shared.tls_cert:
            self._tls_ca = Path(shared.tls_cert).read_bytes()

    async def on_leader(self, name: str, request: Any, context: grpc.aio.ServicerContext) -> Any | None:
        """On a replica that does not lead: the answer of the leader to the same call, with the
        caller's credentials (every replica shares the secrets file). None: this one leads."""
        if self._shared is None or (self._wiring is not None and self._wiring.term is not None):
            return None
        holder, address = self._shared.leader_address()
        if any(k == _FORWARDED for k, _ in context.invocation_metadata()):
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"replica {self._shared.replica} was forwarded a repair call but is not the leader "
                f"(the lease is moving); try again in a few seconds",
            )
        if not address:
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"no repair leader right now (the lease is "
                f"{self._shared.lease_info.describe() if self._shared.lease_info else 'unknown'}); "
                f"a replica takes it within leader_lease_s: try again in a few seconds",
            )
        if (
            self._tls_ca is None
            and not self._shared.allow_plaintext
            and not is_loopback(address.rpartition(":")[0])
        ):
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"the repair leader {holder} is at {address}, another host, and this replica has no TLS: "
                "the caller's token is not sent there in clear (set tls_cert, or allow_plaintext)",
            )
        metadata = [(k, v) for k, v in context.invocation_metadata() if k == "authorization"]
        metadata.append((_FORWARDED, self._shared.replica))
        try:
            async with _channel(address, self._tls_ca, self._shared.tls_server_name) as channel:
                stub = fleet_pb2_grpc.FleetStub(channel)
                return await getattr(stub, name)(request, metadata=metadata, timeout=60)
        except grpc.aio.AioRpcError as exc:
            raise Refused(
                exc.code(), f"{exc.details()} (answered by the repair leader {holder} at {address})"
            ) from exc


def _channel(address: str, tls_ca: bytes | None, server_name: str = "") -> grpc.aio.Channel:
    if tls_ca is not None:
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(tls_ca), options=options)
    return grpc.aio.insecure_channel(address)
