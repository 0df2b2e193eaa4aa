"""What every Fleet API call goes through: authentication, the role it needs, counting and
logging, and a refusal turned into its gRPC status (with secrets redacted)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from gpufleet.common.redact import redact

log = logging.getLogger("gpufleet.aggregator.fleet")


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def rpc(
    role: str, forward: bool = False
) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Authenticate, require role, count and log; turn Refused into its gRPC status. forward:
    on a replica that is not the repair leader, the leader answers (`_on_leader`)."""

    def wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def method(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            name = fn.__name__
            try:
                principal = self._authorize(context, role)
                result = await self._on_leader(name, request, context) if forward else None
                if result is None:
                    result = await fn(self, request, principal)
            except Refused as r:
                self._metrics.fleet_requests.labels(method=name, code=r.code.name).inc()
                message = redact(r.message)  # a store's URL or DSN never reaches a client with its password
                log.info("fleet %s refused: %s", name, message, extra={"code": r.code.name})
                await context.abort(r.code, message)
            self._metrics.fleet_requests.labels(method=name, code="OK").inc()
            return result

        method.__name__ = fn.__name__
        return method

    return wrap
