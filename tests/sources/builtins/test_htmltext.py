"""HTML as Markdown or text."""

from __future__ import annotations

import time

import pytest

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


# Pages built to make a converter take quadratic time (or worse). The old one took ~10 minutes
# for a megabyte of <pre> spaces, minutes for 300 kB of "<a <a <a" (html.parser before Python
# 3.13.5 searches the rest of the page again from every "<" of a tag left open), and its list
# indentation grew with the nesting depth on every item. Each must come out right; the test's
# own timeout is the guard, no duration is asserted.
ADVERSARIAL = [
    ("pre spaces", "<pre>" + " " * (1 << 20) + "x</pre>", "x"),
    ("trailing spaces", "<pre>x" + " " * (1 << 20) + "</pre>", "x"),
    ("cell tabs", "<p>kept</p>" + "<td>" * 200_000, "kept"),
    ("open tags", "<p>kept</p>" + "<a " * 300_000, "kept"),
    ("open quotes", "<p>kept</p>" + "<a b='" * 150_000, "kept"),
    ("open comment", "<p>kept</p>" + "<!--" * 200_000, "kept"),
    ("open declarations", "<p>kept</p>" + "<![CDATA[" * 100_000 + "<?" * 100_000, "kept"),
    ("open end tags", "<p>kept</p>" + "</a" * 200_000, "kept"),
    ("text then blocks", "x" * 500_000 + "<p></p>" * 100_000, "x" * 500_000),
    ("entities", "&amp;" * 200_000, "&" * 200_000),
    ("open script", "<p>kept</p><script>" + "</scrip" * 100_000, "kept"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("label", "page", "expected"), ADVERSARIAL, ids=[a[0] for a in ADVERSARIAL]
)
def test_adversarial_pages_convert_in_linear_time(label: str, page: str, expected: str) -> None:
    assert html_to_text(page, "text") == expected


@pytest.mark.timeout(60)
def test_deep_lists_are_indented_to_a_bounded_depth() -> None:
    page = "<ul><li>top" + "<ul>" * 10_000 + "<li>deep" * 10_000
    lines = html_to_text(page, "markdown").splitlines()
    assert lines[:2] == ["- top", ""]
    assert lines[2:] == [" " * 18 + "- deep"] * 10_000  # ten levels: 9 indents of 2


@pytest.mark.timeout(60)
def test_a_huge_attribute_value_is_kept_whole() -> None:
    href = "https://example.com/" + "h" * (1 << 20)
    assert html_to_text(f'<a href="{href}">link</a>', "markdown") == f"[link]({href})"


def test_the_conversion_stops_at_its_deadline() -> None:
    # it runs on a thread that nobody waits for once the call has timed out
    page = "<p>x</p>" * 10_000
    with pytest.raises(TimeoutError):
        html_to_text(page, "text", deadline=time.monotonic() - 1)
    assert html_to_text("<p>x</p>", "text", deadline=time.monotonic() - 1) == "x"  # few tags
    assert html_to_text(page, "text", deadline=time.monotonic() + 600).startswith("x\n\nx")


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("a < b and c<3", "a < b and c<3"),  # a "<" that starts no tag is text
        ("<p title='x > y'>in</p>after", "in\n\nafter"),  # ">" inside a quoted value
        ("<P CLASS=x>up</P><BR/>next", "up\n\nnext"),  # names are case-insensitive
        ("a<!-->b<!--->c<!-- x -->d", "abcd"),  # empty comments end at once
        ("<script>if (a<b) document.write('<p>no</p>')</script>yes", "yes"),
        ("<a href='/x?a=1&amp;b=2'>q</a>", "q"),
        ("kept</ not a tag>", "kept"),
        ("kept<a href='never closed", "kept"),
    ],
    ids=[
        "bare <",
        "> in a quoted value",
        "upper case",
        "empty comments",
        "script content",
        "entity in attribute",
        "bogus end tag",
        "open quote at the end",
    ],
)
def test_markup_is_read_as_browsers_read_it(page: str, expected: str) -> None:
    assert html_to_text(page, "text") == expected


def test_attribute_values_are_decoded() -> None:
    assert html_to_text("<a href='/x?a=1&amp;b=2'>q</a>", "markdown") == "[q](/x?a=1&b=2)"
    assert html_to_text('<img alt="a &lt; b" src=p.png>', "markdown") == "![a < b](p.png)"
