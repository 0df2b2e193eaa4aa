"""Names and reasons reach people through Slack's mrkdwn and the dashboard's Markdown: each is
escaped for its medium, property-tested over any text (docs/security.md "Serving pools and the
capacity guard"). Slack: no '<' or '>' survives (no mention, no link), and Slack's unescaping
gives the text back. Dashboard: CommonMark (markdown-it-py, the reference's port) renders the
escaped text as that text alone: no link, emphasis, heading, code or HTML."""

from __future__ import annotations

import html
import re

from hypothesis import example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from gpufleet.dashboard.look import md
from gpufleet.repair.alerts.base import Alert
from gpufleet.repair.alerts.slack import SlackSink, mrkdwn_text

TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=80)
ATTACKS = ["<!channel>", "<https://evil.example|click here>", "[x](https://e)", "**b** _i_ `c`", "# h", "<b>"]


@settings(max_examples=400)
@given(TEXT)
@example("<!channel> <https://evil.example|click> &amp;")
def test_slack_text_shows_any_text_as_written(text: str) -> None:
    out = mrkdwn_text(text)
    assert "<" not in out and ">" not in out
    assert out.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") == text


def test_a_slack_alert_escapes_what_a_node_or_person_put_in_it() -> None:
    alert = Alert("inc-1", "firing", "n1", "cordoned", "critical", f"pool {ATTACKS[0]} {ATTACKS[1]}", 0)
    text = SlackSink("http://127.0.0.1:1/hook").request(alert).body["text"]
    assert "<!channel>" not in text and "<https://" not in text
    assert "&lt;!channel&gt;" in text


_RENDERER = MarkdownIt("commonmark")


def rendered_text(markdown: str) -> str:
    """What a reader sees: the HTML CommonMark makes of it, inside its one paragraph, unescaped."""
    out = _RENDERER.render(markdown).strip()
    if not out:
        return ""
    assert out.startswith("<p>") and out.endswith("</p>"), out
    inner = out[3:-4]
    assert not re.search(r"<(?!br />)[a-z/]", inner), f"markup in {inner!r}"
    return html.unescape(inner.replace("<br />\n", "\n"))


@settings(max_examples=400)
@given(st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=80).map(str.strip))
@example(ATTACKS[2])
@example(ATTACKS[3])
@example(ATTACKS[4])
@example(ATTACKS[5])
def test_dashboard_markdown_shows_any_text_as_written(text: str) -> None:
    rendered = rendered_text(md(text))
    # CommonMark folds runs of spaces and trims each line's ends; nothing else may differ.
    assert " ".join(rendered.split()) == " ".join(text.split())
