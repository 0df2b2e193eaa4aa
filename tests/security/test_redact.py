"""redact() (common/redact.py) property-tested over whole texts: whatever a password, a query, a
webhook path or a bearer credential holds, and wherever it stands in a message, it is gone and
what says where (scheme, user, host) stays. The three leaks an attacker showed are among the
cases: a password holding '@', a `Bearer` value, a Slack webhook's path."""

from __future__ import annotations

import urllib.parse

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.common.redact import redact

SECRET = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="'\"<>\\"),
    min_size=8,
    max_size=30,
).map(lambda s: "Zq9" + s)  # never a piece of the words around it
USER = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
HOST = st.from_regex(r"[a-z][a-z0-9-]{0,15}(\.[a-z]{2,6}){0,2}", fullmatch=True)
AROUND = st.sampled_from(["cannot reach {} : refused", "{}", "store at {}.", "dial ({}) failed", "x={} y"])
PROPERTY = settings(max_examples=400, deadline=None)


@PROPERTY
@given(
    USER,
    SECRET,
    HOST,
    st.sampled_from(["", "/", "/db", "/a/b"]),
    AROUND,
    st.sampled_from(["postgresql", "http", "https", "influxdb"]),
)
def test_a_urls_password_is_gone_whatever_it_holds(
    user: str, password: str, host: str, path: str, around: str, scheme: str
) -> None:
    # As a client writes it: the password percent-encoded where a URL needs it, '@' and ':' too
    # or not (a raw '@' in a password is what leaked: the userinfo ends at the last '@').
    encoded = urllib.parse.quote(password, safe="@:!$&()*+,;=~-._")
    url = f"{scheme}://{user}:{encoded}@{host}:5432{path}"
    out = redact(around.format(url))
    assert encoded not in out and password not in out, out
    assert f"{scheme}://{user}:***@{host}:5432" in out, out


@PROPERTY
@given(HOST, st.lists(SECRET, min_size=1, max_size=3), AROUND)
def test_a_query_string_is_gone(host: str, values: list[str], around: str) -> None:
    query = urllib.parse.urlencode({f"k{i}": v for i, v in enumerate(values)})
    out = redact(around.format(f"http://{host}:8086/query?{query}"))
    assert all(urllib.parse.quote_plus(v) not in out and v not in out for v in values), out
    assert f"http://{host}:8086/query?***" in out


@PROPERTY
@given(
    st.sampled_from(
        [
            "https://hooks.slack.com/services/{a}/{b}/{c}",
            "https://discord.com/api/webhooks/{a}/{c}",
            "https://example.webhook.office.com/webhookb2/{a}/IncomingWebhook/{b}/{c}",
        ]
    ),
    *(st.from_regex(r"[A-Za-z0-9]{6,30}", fullmatch=True).map(lambda s: "Zq9" + s) for _ in range(3)),
    AROUND,
)
def test_a_webhooks_path_is_gone(template: str, a: str, b: str, c: str, around: str) -> None:
    out = redact(around.format(template.format(a=a, b=b, c=c)))
    assert c not in out and b not in out, out


@PROPERTY
@given(
    st.sampled_from(["Bearer", "bearer", "Basic"]),
    st.from_regex(r"[A-Za-z0-9._~+/=-]{12,60}", fullmatch=True),
    st.sampled_from(["authorization: {} {}", "sent {} {} to the API", "{} {}"]),
)
def test_a_bearer_or_basic_credential_is_gone(scheme: str, credential: str, around: str) -> None:
    out = redact(around.format(scheme, credential))
    assert credential not in out, out


@PROPERTY
@given(
    st.sampled_from(["password", "PASSWORD", "token", "secret", "api_key", "client_secret"]),
    st.sampled_from(["=", " = ", ": "]),
    st.from_regex(r"[A-Za-z0-9!$%*+/@^_~-]{6,30}", fullmatch=True).map(lambda s: "Zq9" + s),
    st.sampled_from(["host=db user=gf {} dbname=x", "{}", "settings: {}, retry"]),
)
def test_a_keyword_password_is_gone(word: str, sep: str, value: str, around: str) -> None:
    out = redact(around.format(f"{word}{sep}{value}"))
    assert value not in out and f"{word}{sep}***" in out, out


@PROPERTY
@given(st.text(max_size=200))
def test_any_text_is_redacted_without_error_and_twice_is_once(text: str) -> None:
    once = redact(text)
    assert redact(once) == once


def test_the_leaks_found_are_closed() -> None:
    assert redact("postgresql://gf:p@ss@db/x") == "postgresql://gf:***@db/x"
    assert "abcdefghijklmnop" not in redact("Authorization: Bearer gfo1_abcdefghijklmnop")
    assert redact("posting to https://hooks.slack.com/services/T0/B0/XXXX: 404") == (
        "posting to https://hooks.slack.com/services/***: 404"
    )
    # What says where and what happened stays.
    assert redact("the bearer token is not one this aggregator knows") == (
        "the bearer token is not one this aggregator knows"
    )
