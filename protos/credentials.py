"""Who a node is, as the ingest contract defines it: the one node-name grammar and the
collector credential (docs/security.md "Node names" and "Collector credentials").

A node name is a hostname by one grammar: a letter or digit, then up to 252 letters, digits,
dots, underscores or hyphens. It never starts with '-' (an option to every tool it reaches),
and holds no space, comma, bracket, slash, colon, quote or '=' (a Slurm hostlist, a second
argument, a path, a URL part, a shell word). Names are checked against it at the Hello, when a
token is issued, in the collector's settings and again in every repair backend before an argv,
URL or path is built from one.

A collector token (version 2) names its node, carries a token id and an expiry, and is signed
with HMAC-SHA256 under the fleet's collector secret:

    gfc2_<base64url("node|token_id|expires_unix")>.<base64url(mac)>

so the aggregator learns and checks the node from the credential alone, before it decodes a
single message of the stream, and one token can be revoked by its id without rotating the
fleet secret."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass

NODE_NAME_MAX = 253
NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
NODE_NAME_RULE = "a letter or digit, then up to 252 letters, digits, '.', '_' or '-'"
# Words a scheduler reads as other than one node, whatever their case: Slurm's `NodeName=ALL`
# is every node (`scontrol update NodeName=ALL State=DRAIN` drains the cluster). Kubernetes'
# reserved path segments ("." and "..") cannot match the grammar (it starts with a letter or
# digit). ("default" stays a name: slurm.conf's NodeName=DEFAULT is no scontrol target, and it
# is the default cluster's name.)
RESERVED_NODE_NAMES = frozenset({"all"})
TOKEN_PREFIX = "gfc2_"
LEGACY_TOKEN_PREFIX = "gfc1_"
TOKEN_ID_RE = re.compile(r"[a-z0-9-]{1,32}")
SHARED_SECRET_TOKEN_ID = "shared-secret"  # the id of every token a node derives from secret_file
_MAC_CONTEXT = b"gpufleet-collector-v2\0"


def node_name_problem(name: str) -> str:
    """Why name is not a usable node (or cluster) name ("" when it is). The message quotes
    the rule."""
    if not name:
        return "it is empty"
    if len(name) > NODE_NAME_MAX:
        return f"it is {len(name)} characters long (at most {NODE_NAME_MAX})"
    if name.lower() in RESERVED_NODE_NAMES:
        return f"{name!r} is a scheduler keyword (Slurm's NodeName={name.upper()} names every node)"
    if NODE_NAME_RE.fullmatch(name):
        return ""
    if not (name[0].isascii() and name[0].isalnum()):
        return f"it starts with {name[0]!r}; a name is {NODE_NAME_RULE}"
    bad = next(c for c in name if not (c.isascii() and (c.isalnum() or c in "._-")))
    return f"it holds {bad!r}; a name is {NODE_NAME_RULE}"


def check_node_name(name: str, what: str = "node name") -> str:
    """name, or ValueError saying why it is not a node name."""
    why = node_name_problem(name)
    if why:
        raise ValueError(f"{what} {name[:300]!r} is not usable: {why}")
    return name


class TokenError(ValueError):
    """A collector token that is not one: the message says what is wrong with it."""


@dataclass(frozen=True)
class CollectorClaims:
    """What a collector token says, before its signature is checked."""

    node: str
    token_id: str
    expires_unix: int
    payload: bytes
    mac: bytes


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def token_mac(secret: str, payload: bytes) -> bytes:
    return hmac.new(secret.encode(), _MAC_CONTEXT + payload, hashlib.sha256).digest()


def collector_token(secret: str, node: str, token_id: str, expires_unix: int) -> str:
    """Node's credential with this id and expiry (seconds since 1970), signed under secret."""
    check_node_name(node)
    if not TOKEN_ID_RE.fullmatch(token_id):
        raise ValueError(f"token id {token_id!r} must be 1-32 of a-z, 0-9 and '-'")
    payload = f"{node}|{token_id}|{int(expires_unix)}".encode()
    return f"{TOKEN_PREFIX}{_b64(payload)}.{_b64(token_mac(secret, payload))}"


def parse_collector_token(token: str) -> CollectorClaims:
    """The claims of a version-2 token (not yet verified); TokenError when it is not one."""
    if token.startswith(LEGACY_TOKEN_PREFIX):
        raise TokenError(
            "this is a version-1 collector token (gfc1_), which names no node, never expires and "
            "cannot be revoked; issue a new one with `gpufleet auth collector-token NODE`"
        )
    if not token.startswith(TOKEN_PREFIX) or token.count(".") != 1 or len(token) > 1024:
        raise TokenError("not a gpufleet collector token (gfc2_...)")
    body, mac_text = token[len(TOKEN_PREFIX) :].split(".")
    try:
        payload, mac = _unb64(body), _unb64(mac_text)
        node, token_id, expires = payload.decode("ascii").split("|")
        expires_unix = int(expires)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise TokenError("a gfc2_ collector token whose claims do not decode") from None
    if node_name_problem(node) or not TOKEN_ID_RE.fullmatch(token_id) or len(mac) != 32:
        raise TokenError("a gfc2_ collector token whose claims are malformed")
    return CollectorClaims(node, token_id, expires_unix, payload, mac)
