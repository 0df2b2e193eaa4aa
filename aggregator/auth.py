"""Credentials for both gRPC services.

Collectors: a token bound to one node name, HMAC-SHA256(secret, node). The aggregator
needs only the secret to check any node's token, so enrolling a node is issuing its
token (`gpufleet auth collector-token NODE`), with no list to keep in sync.

Fleet API: bearer tokens with a name (recorded in the audit log) and a role. Only the
SHA-256 of each token is stored in the secrets file.

Secrets file (TOML, readable only by the aggregator's user):

    collector_secret = "<random hex>"
    [[fleet_tokens]]
    name = "alice"
    role = "operator"          # viewer | operator
    sha256 = "<hex digest of the token>"
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.protos.credentials import collector_token

ROLES = ("viewer", "operator")
_ROLE_RANK = {role: i for i, role in enumerate(ROLES)}


class AuthError(Exception):
    """A credential is missing, malformed or wrong; the message says which."""


@dataclass(frozen=True)
class Principal:
    name: str
    role: str

    def has_role(self, role: str) -> bool:
        return _ROLE_RANK[self.role] >= _ROLE_RANK[role]


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise AuthError("authorization metadata must be 'Bearer <token>'")
            return token.strip()
    raise AuthError("no credential: send 'authorization: Bearer <token>' metadata")


class Authenticator:
    def __init__(self, collector_secret: str, fleet_tokens: dict[str, Principal]) -> None:
        if len(collector_secret) < 32:
            raise ValueError("collector_secret must be at least 32 characters of randomness")
        self._collector_secret = collector_secret
        self._fleet = fleet_tokens  # sha256 hex -> principal

    @classmethod
    def from_file(cls, path: str | Path) -> Authenticator:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"cannot read secrets file {path}: {exc}") from exc
        secret = data.get("collector_secret")
        if not isinstance(secret, str):
            raise ValueError(f"secrets file {path}: collector_secret (a string) is missing")
        tokens: dict[str, Principal] = {}
        for i, entry in enumerate(data.get("fleet_tokens", [])):
            name, role, digest = entry.get("name"), entry.get("role"), entry.get("sha256")
            if role not in ROLES:
                raise ValueError(
                    f"secrets file {path}: fleet_tokens[{i}] ({name!r}) has role {role!r}; "
                    f"use one of {', '.join(ROLES)}"
                )
            if not (isinstance(digest, str) and len(digest) == 64):
                raise ValueError(
                    f"secrets file {path}: fleet_tokens[{i}] ({name!r}) needs a sha256 hex digest"
                )
            tokens[digest.lower()] = Principal(str(name), role)
        return cls(secret, tokens)

    def check_collector(self, token: str, node: str) -> None:
        """Raise AuthError unless token is this node's credential."""
        expected = collector_token(self._collector_secret, node)
        if not hmac.compare_digest(expected.encode(), token.encode()):
            raise AuthError(f"the collector credential presented is not valid for node {node!r}")

    def check_fleet(self, token: str) -> Principal:
        principal = self._fleet.get(token_sha256(token))
        if principal is None:
            raise AuthError("the bearer token is not one this aggregator knows")
        return principal


def is_service_account_token(token: str) -> bool:
    """A Kubernetes ServiceAccount token is a JWT: three base64url parts, the header 'eyJ...'."""
    return token.startswith("eyJ") and token.count(".") == 2


class CollectorAuth:
    """Which collector credentials this aggregator takes (setting collector_auth): per-node HMAC
    tokens, Kubernetes ServiceAccount tokens bound to their pod's node (k8s_auth.py), or both.
    A JWT goes to the Kubernetes check when it is on; anything else to the HMAC check."""

    def __init__(
        self, hmac_auth: Authenticator | None, kubernetes: Callable[[str, str], None] | None
    ) -> None:
        if hmac_auth is None and kubernetes is None:
            raise ValueError("collector_auth names no way for collectors to authenticate")
        self._hmac = hmac_auth
        self._kubernetes = kubernetes

    async def check(self, token: str, node: str) -> None:
        """Raise AuthError unless token proves it is node's collector."""
        if self._kubernetes is not None and is_service_account_token(token):
            await asyncio.to_thread(self._kubernetes, token, node)
            return
        if self._hmac is None:
            raise AuthError(
                "this aggregator takes only Kubernetes ServiceAccount tokens (collector_auth = kubernetes): "
                "mount the projected token and point token_file at it"
            )
        self._hmac.check_collector(token, node)


def new_secrets_file(path: Path, tokens: list[tuple[str, str]]) -> dict[str, str]:
    """Write a secrets file with a fresh collector secret and one fleet token per
    (name, role); return {name: token}. The file is created readable by its owner only."""
    issued = {name: f"gf{role[0]}1_{secrets.token_urlsafe(32)}" for name, role in tokens}
    lines = [f'collector_secret = "{secrets.token_hex(32)}"', ""]
    for name, role in tokens:
        lines += [
            "[[fleet_tokens]]",
            f'name = "{name}"',
            f'role = "{role}"',
            f'sha256 = "{token_sha256(issued[name])}"',
            "",
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines))
    return issued
