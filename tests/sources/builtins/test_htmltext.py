"""HTML as Markdown or text."""

from __future__ import annotations

from toolmesh.sources.builtins.htmltext import html_to_text

PAGE = """<html><head><title>The Page</title><style>p {color: red}</style>
<script>alert('x')</script></head><body>
<h1>Welcome</h1><p>Some <b>bold</b> and <em>soft</em> words with a
<a href="https://example.com/more">link</a>.</p>
<ul><li>one</li><li>two</li></ul><ol><li>first</li></ol>
<pre>code  kept
  as is</pre><p>Inline <code>x = 1</code>.</p></body></html>"""


def test_markdown() -> None:
    text = html_to_text(PAGE, "markdown")
    assert text.startswith("# Welcome\n\nSome")  # the page's own heading, not its title
    assert "Some **bold** and *soft* words with a [link](https://example.com/more)." in text
    assert "- one\n- two" in text and "1. first" in text
    assert "```\ncode  kept\n  as is\n```" in text and "`x = 1`" in text
    assert "alert" not in text and "color" not in text


def test_text() -> None:
    text = html_to_text(PAGE, "text")
    assert text.startswith("The Page\n\nWelcome")
    assert "Some bold and soft words with a link." in text and "**" not in text
