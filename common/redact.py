"""Secrets kept out of logs and of errors a client sees (docs/security.md "Secrets").

Each URL in a text is found (a scheme, `://`, up to the next space or quote) and taken apart as
a URL (urllib.parse.urlsplit), not matched by a pattern: the userinfo ends at the *last* '@'
of the authority (RFC 3986), so a password that holds '@' or ':' goes whole. What goes:
- the password of the userinfo (the user name stays: it says who);
- the query string (`?password=`, `?token=`, signed URLs) and the fragment;
- the path of a webhook URL, where the path is the credential (Slack, Discord, Teams, Google
  Chat, PagerDuty's enqueue keys) past its first segment, and any path segment that looks like
  a key (24 or more letters, digits, '_' or '-', with both letters and digits);
- `Bearer` and `Basic` credentials, and `authorization: ...` values;
- keyword passwords of a DSN or a setting (`password=`, `token=`, `secret=`, `api_key=`, ...)."""

from __future__ import annotations

import re
import urllib.parse

# A URL's extent in free text: scheme://, then anything but space, quotes and angle brackets.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
# Punctuation that ends a sentence around a URL ("... http://h/x: refused", "(see http://h/x).")
_TRAILING = ".,;:)]}!"
_KEYWORD = re.compile(
    r"(?i)\b(password|passwd|pwd|token|secret|sslpassword|api_?key|access_?token|routing_?key|"
    r"integration_?key|client_?secret)(\s*[=:]\s*)('[^']*'|\"[^\"]*\"|[^\s,;&]+)"
)
_AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic)(\s+)([A-Za-z0-9._~+/=-]{12,})")
_AUTH_HEADER = re.compile(r"(?i)\b(authorization|x-api-key|x-auth-token)(\s*[:=]\s*)([^\r\n,;]+)")
# Hosts whose URL path is the credential (the path past its first segment goes).
_WEBHOOK_HOSTS = (
    "hooks.slack.com",
    "discord.com",
    "discordapp.com",
    "webhook.office.com",
    "outlook.office.com",
    "chat.googleapis.com",
    "events.pagerduty.com",
)
_KEYLIKE = re.compile(r"(?=[A-Za-z0-9_-]*[A-Za-z])(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{24,}")
MASK = "***"


def _webhook(host: str) -> bool:
    return any(host == h or host.endswith("." + h) for h in _WEBHOOK_HOSTS)


def redact_url(url: str) -> str:
    """One URL with its secrets replaced (the module's list)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # not a URL after all (a bad port, an unclosed '['): hide all past the scheme
        scheme, _, _ = url.partition("://")
        return f"{scheme}://{MASK}"
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        userinfo = f"{user}:{MASK}@" if colon else f"{user}@"
    host = (parts.hostname or "").lower()
    segments = parts.path.split("/")
    if _webhook(host) and len(segments) > 2:
        segments = [*segments[:2], MASK]
    else:
        segments = [MASK if _KEYLIKE.fullmatch(s) else s for s in segments]
    out = f"{parts.scheme}://{userinfo}{hostport}{'/'.join(segments)}"
    if parts.query or url.endswith("?"):
        out += "?" + MASK
    if parts.fragment:
        out += "#" + MASK
    return out


def _url(match: re.Match[str]) -> str:
    url = match.group(0)
    kept = len(url.rstrip(_TRAILING))
    return redact_url(url[:kept]) + url[kept:]


def redact(text: str) -> str:
    """text with every URL's secrets, every bearer or basic credential and every keyword
    password replaced by ***."""
    if not text:
        return text
    text = _URL.sub(_url, text)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    text = _AUTH_SCHEME.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    return _KEYWORD.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
