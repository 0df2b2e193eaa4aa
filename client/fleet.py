"""How the CLI finds and talks to the Fleet API.

Address and token, first found wins:
  1. flags --fleet ADDR, --token TOKEN (or --token-file FILE), --allow-plaintext
  2. environment GPUFLEET_FLEET, GPUFLEET_TOKEN, GPUFLEET_TLS_CA, GPUFLEET_ALLOW_PLAINTEXT=1
  3. the client config file: $GPUFLEET_CLIENT_CONFIG, else ~/.config/gpufleet/client.toml
     (keys fleet, token, tls_ca, allow_plaintext). `gpufleet demo` writes this file while it
     runs, so `gpufleet nodes` in another shell finds the demo without flags.
  4. fleet 127.0.0.1:7711, no token

A token is never sent in clear to another machine: without tls_ca, an address off loopback is
refused unless allow_plaintext says the network is trusted (as the daemons refuse it:
docs/security.md "In transit").
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpufleet.client.exits import ClientError, Exit
from gpufleet.client.rpcs import FleetRpc, Req, Resp, Rpc
from gpufleet.common.net import dial_host, is_loopback
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc

DEFAULT_FLEET = "127.0.0.1:7711"


def client_config_path(env: Mapping[str, str] = os.environ) -> Path:
    if env.get("GPUFLEET_CLIENT_CONFIG"):
        return Path(env["GPUFLEET_CLIENT_CONFIG"])
    base = Path(env.get("XDG_CONFIG_HOME") or Path(env.get("HOME", "~")).expanduser() / ".config")
    return base / "gpufleet" / "client.toml"


@dataclass
class ClientSettings:
    fleet: str
    token: str
    tls_ca: str
    source: str  # where the address came from, for error messages
    allow_plaintext: bool = False  # send the token without TLS off loopback (a trusted network)


def resolve_client(
    fleet: str | None,
    token: str | None,
    token_file: str | None,
    env: Mapping[str, str] = os.environ,
    allow_plaintext: bool = False,
) -> ClientSettings:
    path = client_config_path(env)
    file_data: dict[str, object] = {}
    if path.exists():
        try:
            file_data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ClientError(f"cannot read client config {path}: {exc}", Exit.USAGE) from exc
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise ClientError(f"cannot read --token-file {token_file}: {exc}", Exit.USAGE) from exc
    if fleet:
        address, source = fleet, "--fleet"
    elif env.get("GPUFLEET_FLEET"):
        address, source = env["GPUFLEET_FLEET"], "GPUFLEET_FLEET"
    elif file_data.get("fleet"):
        address, source = str(file_data["fleet"]), str(path)
    else:
        address, source = DEFAULT_FLEET, "the default"
    return ClientSettings(
        fleet=address,
        token=token or env.get("GPUFLEET_TOKEN") or str(file_data.get("token", "")),
        tls_ca=env.get("GPUFLEET_TLS_CA") or str(file_data.get("tls_ca", "")),
        source=source,
        allow_plaintext=allow_plaintext
        or env.get("GPUFLEET_ALLOW_PLAINTEXT", "").lower() in ("1", "true", "yes")
        or file_data.get("allow_plaintext") is True,
    )


class FleetClient:
    """A blocking Fleet API client (the CLI is a short-lived, one-call-at-a-time process)."""

    def __init__(self, settings: ClientSettings, timeout_s: float = 15.0) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        if settings.tls_ca:
            try:
                ca = Path(settings.tls_ca).read_bytes()
            except OSError as exc:
                raise ClientError(
                    f"cannot read the TLS CA file {settings.tls_ca}: {exc}", Exit.USAGE
                ) from exc
            creds = grpc.ssl_channel_credentials(ca)
            self._channel = grpc.secure_channel(settings.fleet, creds)
        else:
            host = dial_host(settings.fleet)
            if settings.token and not is_loopback(host) and not settings.allow_plaintext:
                raise ClientError(
                    f"the Fleet API at {settings.fleet} (from {settings.source}) is not on this machine "
                    "and no TLS CA is set: the bearer token would cross the network in clear. Set the "
                    "CA that signed the aggregator's certificate (GPUFLEET_TLS_CA or tls_ca in "
                    f'{client_config_path()}; docs/security.md "In transit"), or pass '
                    "--allow-plaintext (GPUFLEET_ALLOW_PLAINTEXT=1) on a network you trust",
                    Exit.USAGE,
                )
            self._channel = grpc.insecure_channel(settings.fleet)
        self._stub = fleet_pb2_grpc.FleetStub(self._channel)

    def call(self, rpc: Rpc[Req, Resp], request: Req, timeout_s: float | None = None) -> Resp:
        """One Fleet API call (client/rpcs.py names each with its request and answer types)."""
        if not isinstance(request, rpc.request):
            raise TypeError(f"{rpc.name} takes a {rpc.request.__name__}, not a {type(request).__name__}")
        metadata = (("authorization", f"Bearer {self.settings.token}"),) if self.settings.token else ()
        try:
            return getattr(self._stub, rpc.name)(  # type: ignore[no-any-return]
                request, metadata=metadata, timeout=timeout_s or self.timeout_s
            )
        except grpc.RpcError as exc:
            raise self._explain(exc) from None

    def list_nodes(self, request: fleet_pb2.ListNodesRequest | None = None) -> fleet_pb2.ListNodesResponse:
        """Every node, as one ListNodesResponse: the Fleet API answers a page at a time (so no
        fleet makes one answer too big), and this asks for each page in turn."""
        page = fleet_pb2.ListNodesRequest()
        if request is not None:
            page.CopyFrom(request)
        merged = fleet_pb2.ListNodesResponse()
        while True:
            answer = self.call(FleetRpc.ListNodes, page)
            merged.nodes.extend(answer.nodes)
            merged.server_time_unix_ns = merged.server_time_unix_ns or answer.server_time_unix_ns
            merged.total_nodes = answer.total_nodes
            if not answer.next_page_token:
                return merged
            page.page_token = answer.next_page_token

    def _explain(self, exc: grpc.RpcError) -> ClientError:
        code, details = exc.code(), exc.details()  # type: ignore[attr-defined]
        where = f"the Fleet API at {self.settings.fleet} (address from {self.settings.source})"
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return ClientError(
                f"cannot reach {where}: {details}. Is `gpufleet aggregator run` or "
                f"`gpufleet demo` running? {self._where_to_fix()}",
                Exit.UNREACHABLE,
            )
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return ClientError(
                f"{where} rejected the credential: {details}. Pass a token with "
                "--token, --token-file or GPUFLEET_TOKEN.",
                Exit.CREDENTIAL,
            )
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return ClientError(f"permission denied: {details}", Exit.CREDENTIAL)
        if code == grpc.StatusCode.NOT_FOUND:
            return ClientError(details, Exit.NOT_FOUND)
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return ClientError(details, Exit.USAGE)  # the request was wrong: same as a bad flag
        return ClientError(f"{code.name}: {details}", Exit.FAILED)

    def _where_to_fix(self) -> str:
        """Where the address that failed came from is where to fix it (not another setting)."""
        source = self.settings.source
        if source == "--fleet":
            return "Check the address given with --fleet: is the aggregator's Fleet API listening there?"
        if source == "GPUFLEET_FLEET":
            return "Check GPUFLEET_FLEET in the environment, or pass --fleet."
        if source == "the default":
            return "Set the address with --fleet or GPUFLEET_FLEET."
        return f"Check `fleet` in {source}, or pass --fleet."

    def close(self) -> None:
        self._channel.close()
