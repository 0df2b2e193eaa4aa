"""Secrets kept out of logs and of errors a client sees: the user:password part and the query
string of every URL in a text, and the password of a keyword DSN ("host=db password=x")."""

from __future__ import annotations

import re

# scheme://[userinfo@]host[/path][?query][#fragment]: userinfo and query are where URLs carry
# credentials (postgresql://u:pw@h/db, http://u:pw@influx:8086, ...?password=x&token=y).
_URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/@?#]*@)?(?P<rest>[^\s?#'\"]*)"
    r"(?P<query>\?[^\s#'\"]*)?"
)
_KEYWORD = re.compile(r"(?i)\b(password|passwd|pwd|token|secret|sslpassword)\s*=\s*('[^']*'|\"[^\"]*\"|\S+)")


def _url(match: re.Match[str]) -> str:
    userinfo = match.group("userinfo")
    if userinfo:
        user = userinfo[:-1].split(":", 1)[0]
        userinfo = f"{user}:***@" if ":" in userinfo else f"{user}@"
    query = "?***" if match.group("query") else ""
    return f"{match.group('scheme')}{userinfo or ''}{match.group('rest')}{query}"


def redact(text: str) -> str:
    """text with every URL's password and query string, and every keyword password, replaced."""
    if not text:
        return text
    text = _URL.sub(_url, text)
    return _KEYWORD.sub(lambda m: f"{m.group(1)}=***", text)
