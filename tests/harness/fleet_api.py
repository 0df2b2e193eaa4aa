"""Fleet API call metadata: a bearer token, as every front end sends it."""

from __future__ import annotations


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)
