"""Credentials for both gRPC services (docs/security.md).

Collectors: who a stream is comes from its credential alone, before a single message of the
stream is read: a per-node token (protos/credentials.py: node, token id and expiry, signed
with HMAC-SHA256 under the fleet's collector secret), a Kubernetes ServiceAccount token (its
pod's node, k8s_auth.py) or a client certificate whose CN or DNS SAN is the node (mTLS). The
Hello must then name that node. Tokens expire, and one can be revoked by its id (a revocation
list in the control plane) without rotating the secret.

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
import secrets
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpufleet.common.files import write_private
from gpufleet.protos.credentials import (
    TokenError,
    collector_token,
    node_name_problem,
    parse_collector_token,
    token_mac,
)

ROLES = ("viewer", "operator")
_ROLE_RANK = {role: i for i, role in enumerate(ROLES)}
NODE_METADATA = "x-gpufleet-node"  # the node a certificate-authenticated collector speaks for
DEFAULT_TOKEN_DAYS = 365


class AuthError(Exception):
    """A credential is missing, malformed or wrong; the message says which."""


@dataclass(frozen=True)
class Principal:
    name: str
    role: str

    def has_role(self, role: str) -> bool:
        return _ROLE_RANK[self.role] >= _ROLE_RANK[role]


@dataclass(frozen=True)
class CollectorIdentity:
    """The node a collector stream is, as its credential proves it."""

    node: str
    method: str  # token | kubernetes | certificate
    token_id: str = ""  # a collector token's id (what `gpufleet auth revoke` names)
    expires_ns: int = 0  # 0: no expiry of ours (a certificate's is checked by TLS)

    def describe(self) -> str:
        return f"{self.method} {self.token_id}".strip()


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str:
    token = bearer_or_none(metadata)
    if token is None:
        raise AuthError("no credential: send 'authorization: Bearer <token>' metadata")
    return token


def bearer_or_none(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise AuthError("authorization metadata must be 'Bearer <token>'")
            return token.strip()
    return None


def metadata_value(metadata: tuple[tuple[str, str | bytes], ...] | None, name: str) -> str:
    for key, value in metadata or ():
        if key == name:
            return value.decode(errors="replace") if isinstance(value, bytes) else value
    return ""


def issue_collector_token(secret: str, node: str, days: float = DEFAULT_TOKEN_DAYS) -> tuple[str, str, int]:
    """(token, token id, expires_unix) of a new credential for node, valid for days."""
    problem = node_name_problem(node)
    if problem:
        raise ValueError(f"node name {node[:300]!r} is not usable: {problem}")
    if not 0 < days <= 3650:
        raise ValueError(f"a collector token is valid for more than 0 and at most 3650 days, not {days:g}")
    token_id = secrets.token_hex(8)
    expires = int(time.time() + days * 86400)
    return collector_token(secret, node, token_id, expires), token_id, expires


class Revocations:
    """Collector token ids revoked in the control plane, as last read (aggregator/server.py
    reloads them every few seconds; `gpufleet auth revoke` adds one through the Fleet API)."""

    def __init__(self) -> None:
        self.ids: frozenset[str] = frozenset()

    def update(self, ids: set[str] | frozenset[str]) -> None:
        self.ids = frozenset(ids)

    def __contains__(self, token_id: object) -> bool:
        return token_id in self.ids


class Authenticator:
    def __init__(
        self,
        collector_secret: str,
        fleet_tokens: dict[str, Principal],
        revoked: Revocations | None = None,
    ) -> None:
        if len(collector_secret) < 32:
            raise ValueError("collector_secret must be at least 32 characters of randomness")
        self._collector_secret = collector_secret
        self._fleet = fleet_tokens  # sha256 hex -> principal
        self.revoked = revoked or Revocations()

    @classmethod
    def from_file(cls, path: str | Path, revoked: Revocations | None = None) -> Authenticator:
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
        return cls(secret, tokens, revoked)

    def identify_collector(self, token: str, now_ns: int | None = None) -> CollectorIdentity:
        """The node this collector token is for; AuthError unless it is valid now."""
        try:
            claims = parse_collector_token(token)
        except TokenError as exc:
            raise AuthError(str(exc)) from None
        if not hmac.compare_digest(token_mac(self._collector_secret, claims.payload), claims.mac):
            raise AuthError(
                f"the collector token for node {claims.node!r} (id {claims.token_id}) is not signed by "
                "this fleet's collector secret"
            )
        identity = CollectorIdentity(claims.node, "token", claims.token_id, claims.expires_unix * 10**9)
        problem = self.still_valid(identity, now_ns)
        if problem:
            raise AuthError(problem)
        return identity

    def still_valid(self, identity: CollectorIdentity, now_ns: int | None = None) -> str:
        """Why a collector identity is no longer good ("" while it is): expired or revoked."""
        now_ns = now_ns or time.time_ns()
        if identity.expires_ns and now_ns >= identity.expires_ns:
            return (
                f"the collector credential of node {identity.node!r} ({identity.describe()}) expired "
                f"{(now_ns - identity.expires_ns) / 1e9:.0f} s ago; issue a new one "
                f"(`gpufleet auth collector-token {identity.node}`)"
            )
        if identity.token_id and identity.token_id in self.revoked:
            return (
                f"the collector token {identity.token_id} of node {identity.node!r} is revoked; issue "
                f"a new one (`gpufleet auth collector-token {identity.node}`)"
            )
        return ""

    def check_fleet(self, token: str) -> Principal:
        principal = self._fleet.get(token_sha256(token))
        if principal is None:
            raise AuthError("the bearer token is not one this aggregator knows")
        return principal


def is_service_account_token(token: str) -> bool:
    """A Kubernetes ServiceAccount token is a JWT: three base64url parts, the header 'eyJ...'."""
    return token.startswith("eyJ") and token.count(".") == 2


AuthContext = Mapping[str, list[bytes]]


def certificate_names(auth_context: AuthContext | None) -> list[str]:
    """The names a verified client certificate carries (CN, then DNS SANs), as gRPC gives them."""
    if not auth_context:
        return []
    names = [v.decode(errors="replace") for v in auth_context.get("x509_common_name", [])]
    names += [v.decode(errors="replace") for v in auth_context.get("x509_subject_alternative_name", [])]
    return list(dict.fromkeys(names))


class CollectorAuth:
    """Which collector credentials this aggregator takes (setting collector_auth): per-node
    tokens (hmac), Kubernetes ServiceAccount tokens bound to their pod's node (k8s_auth.py),
    client certificates (mtls), or several. A JWT goes to the Kubernetes check when it is on,
    any other bearer token to the token check; a stream with no bearer token is identified by
    its certificate when mtls is on."""

    def __init__(
        self,
        hmac_auth: Authenticator,
        modes: set[str],
        kubernetes: Callable[[str], tuple[str, int]] | None = None,
    ) -> None:
        if not modes:
            raise ValueError("collector_auth names no way for collectors to authenticate")
        self._tokens = hmac_auth
        self._modes = modes
        self._kubernetes = kubernetes

    async def identify(
        self, metadata: tuple[tuple[str, str | bytes], ...] | None, auth_context: AuthContext | None
    ) -> CollectorIdentity:
        """Who this stream is, from its metadata and TLS alone; AuthError when unproven."""
        token = bearer_or_none(metadata)
        if token is None:
            return self._by_certificate(metadata, auth_context)
        if is_service_account_token(token) and self._kubernetes is not None:
            node, expires_ns = await asyncio.to_thread(self._kubernetes, token)
            return CollectorIdentity(node, "kubernetes", "", expires_ns)
        if "hmac" not in self._modes:
            if self._modes == {"kubernetes"}:
                raise AuthError(
                    "this aggregator takes only Kubernetes ServiceAccount tokens (collector_auth = "
                    "kubernetes): mount the projected token and point token_file at it"
                )
            raise AuthError(
                f"this aggregator takes no collector tokens (collector_auth = "
                f"{','.join(sorted(self._modes))}): present a client certificate naming the node"
            )
        return self._tokens.identify_collector(token)

    def _by_certificate(
        self, metadata: tuple[tuple[str, str | bytes], ...] | None, auth_context: AuthContext | None
    ) -> CollectorIdentity:
        names = certificate_names(auth_context)
        if "mtls" not in self._modes or not names:
            raise AuthError(
                "no credential: send 'authorization: Bearer <collector token>' metadata"
                + (" or a client certificate naming the node" if "mtls" in self._modes else "")
            )
        wanted = metadata_value(metadata, NODE_METADATA) or names[0]
        if wanted not in names:
            raise AuthError(
                f"the client certificate names {', '.join(map(repr, names))}, not node {wanted!r}"
            )
        problem = node_name_problem(wanted)
        if problem:
            raise AuthError(f"the client certificate's name {wanted[:300]!r} is no node name: {problem}")
        return CollectorIdentity(wanted, "certificate")

    def still_valid(self, identity: CollectorIdentity, now_ns: int | None = None) -> str:
        return self._tokens.still_valid(identity, now_ns)


def new_secrets_file(path: Path, tokens: list[tuple[str, str]]) -> dict[str, str]:
    """Write a secrets file with a fresh collector secret and one fleet token per
    (name, role); return {name: token}. The file is (re)written readable by its owner only."""
    issued = {name: new_fleet_token(role) for name, role in tokens}
    lines = [f'collector_secret = "{secrets.token_hex(32)}"', ""]
    for name, role in tokens:
        lines += fleet_token_entry(name, role, issued[name])
    write_private(path, "\n".join(lines))
    return issued


def new_fleet_token(role: str) -> str:
    return f"gf{role[0]}1_{secrets.token_urlsafe(32)}"


def fleet_token_entry(name: str, role: str, token: str) -> list[str]:
    """The secrets file's lines for one fleet token (only its digest is kept)."""
    return [
        "[[fleet_tokens]]",
        f"name = {_toml_string(name)}",
        f'role = "{role}"',
        f'sha256 = "{token_sha256(token)}"',
        "",
    ]


def _toml_string(text: str) -> str:
    """A TOML basic string: a token's name with a quote or backslash stays one value."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
