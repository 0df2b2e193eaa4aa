"""The collector credential, part of the ingest contract: HMAC-SHA256 of the node name under
the fleet's collector secret, so a token is bound to one node (ingest.proto)."""

from __future__ import annotations

import base64
import hashlib
import hmac


def collector_token(secret: str, node: str) -> str:
    digest = hmac.new(secret.encode(), b"gpufleet-collector\0" + node.encode(), hashlib.sha256)
    return "gfc1_" + base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")
