"""What every Fleet API call goes through: authentication, the role it needs, counting and
logging, and a refusal turned into its gRPC status (with secrets redacted). An RPC group
(nodes.py, history.py, repair.py) is an object holding an `RpcGate` as `_gate`; its methods
marked `@rpc(role)` are the Fleet RPCs it serves (`served_rpcs`)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc

from gpufleet.aggregator.auth.tokens import Authenticator, AuthError, Principal, bearer
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.common.redact import redact

log = logging.getLogger("gpufleet.aggregator.fleet")


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Forwarding(Protocol):
    async def on_leader(self, name: str, request: Any, context: grpc.aio.ServicerContext) -> Any | None:
        """The repair leader's answer to this call where this replica does not lead; None here."""
        ...


class RpcGate:
    """Who may call, how calls are counted, and where a leader-only call is answered."""

    def __init__(self, auth: Authenticator, metrics: AggregatorMetrics, forwarding: Forwarding) -> None:
        self.metrics = metrics
        self.forwarding = forwarding
        self._auth = auth

    def authorize(self, context: grpc.aio.ServicerContext, role: str) -> Principal:
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


class UserNames:
    """Who may see a user name (personal data, docs/workloads.md "Who sees user names"):
    operators always, viewers where the aggregator's show_user_names is on. One rule for every
    answer that carries a user: jobs, waste findings, the workloads an incident names."""

    def __init__(self, show_user_names: bool) -> None:
        self.show_user_names = show_user_names

    def sees(self, principal: Principal) -> bool:
        return self.show_user_names or principal.has_role("operator")

    @staticmethod
    def fields(user: str, sees: bool) -> dict[str, Any]:
        """The `user` and `user_hidden` fields of an answer: the name, or empty and hidden."""
        return {"user": user if sees else "", "user_hidden": bool(user) and not sees}


def served_rpcs(group: object) -> dict[str, Callable[..., Awaitable[Any]]]:
    """The Fleet RPCs a group (or its class) serves, by name: its methods marked by `rpc`."""
    cls = group if isinstance(group, type) else type(group)
    return {name: getattr(group, name) for name in dir(cls) if getattr(getattr(cls, name), "rpc_role", None)}


def rpc(
    role: str, forward: bool = False
) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Authenticate, require role, count and log; turn Refused into its gRPC status. forward:
    on a replica that is not the repair leader, the leader answers (leader.py)."""

    def wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def method(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            name = fn.__name__
            gate: RpcGate = self._gate
            try:
                principal = gate.authorize(context, role)
                result = await gate.forwarding.on_leader(name, request, context) if forward else None
                if result is None:
                    result = await fn(self, request, principal)
            except Refused as r:
                gate.metrics.fleet_requests.labels(method=name, code=r.code.name).inc()
                message = redact(r.message)  # a store's URL or DSN never reaches a client with its password
                log.info("fleet %s refused: %s", name, message, extra={"code": r.code.name})
                await context.abort(r.code, message)
            gate.metrics.fleet_requests.labels(method=name, code="OK").inc()
            return result

        method.__name__ = fn.__name__
        method.__doc__ = fn.__doc__
        method.rpc_role = role  # type: ignore[attr-defined]
        return method

    return wrap
