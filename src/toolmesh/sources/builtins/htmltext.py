"""HTML as readable text or Markdown, for the http_request tool (standard library only).

Scripts, styles and other invisible parts are dropped; headings, paragraphs, lists, links,
emphasis, code and preformatted blocks are kept as Markdown (or as plain text in text mode).

The page comes from anyone, so the conversion takes time linear in its length whatever it
holds. That is why the tags are read here and not by ``html.parser``: in the Python releases
before the fix of CVE-2025-6069 (3.11.7, for one) it searches the rest of the page again from
every ``<`` of a tag left open, so 120 kB of ``<a <a <a`` take two minutes. Here a comment, tag
or quoted attribute value left open runs to the end of the page (as the HTML standard reads
it), and nothing is searched twice.
"""

from __future__ import annotations

import re
import time
from html import unescape
from typing import Literal

__all__ = ["html_to_text"]

_HIDDEN = {"script", "style", "noscript", "template", "svg", "head", "iframe", "object", "canvas"}
_BLOCK = {
    "p", "div", "section", "article", "header", "footer", "main", "nav", "aside", "ul", "ol",
    "table", "tr", "blockquote", "figure", "figcaption", "form", "dl", "dt", "dd", "address",
    "details", "summary", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "hr", "li",
}  # fmt: skip
_SPACE = re.compile(r"[ \t\r\n\f\v]+")
Attrs = list[tuple[str, str | None]]
_MAX_INDENT = 10  # list levels indented; deeper ones stay at this depth (no output blow-up)

# The tokenizer's pieces. Each regex is matched at one position and cannot backtrack more than
# the characters it consumes, so every character of the page is looked at a bounded number of
# times. "Whitespace" is HTML's: tab, newline, form feed, carriage return and space.
_TAG_NAME = re.compile(r"[a-zA-Z][^\t\n\f\r />]*")
_ATTR_NAME = re.compile(r"[\t\n\f\r /]*([^\t\n\f\r />][^\t\n\f\r />=]*)?")
_EQUALS = re.compile(r"[\t\n\f\r ]*=[\t\n\f\r ]*")
_UNQUOTED = re.compile(r"[^\t\n\f\r >]*")
_RAW_TEXT = {  # elements whose content runs to their end tag, tags inside included
    tag: re.compile(rf"</{tag}[\t\n\f\r />]", re.IGNORECASE) for tag in ("script", "style")
}
_CHECK_EVERY = 1024  # tokens between looks at the clock


class _Converter:
    def __init__(self, markdown: bool) -> None:
        self.markdown = markdown
        self.out: list[str] = []
        self.newlines = 0  # how many newlines the output ends with
        self.hidden = 0
        self.pre = 0
        self.lists: list[list[int]] = []  # per open list: [is_ordered, next number]
        self.links: list[str | None] = []
        self.title: list[str] = []
        self._in_title = False

    # -- tags ------------------------------------------------------------------------------------

    def handle_starttag(self, tag: str, attrs: Attrs) -> None:
        if tag == "title":
            self._in_title = True
        if tag in _HIDDEN:
            self.hidden += 1
            return
        if self.hidden:
            return
        md = self.markdown
        if tag in _BLOCK:
            self._break(2 if tag not in ("li", "tr", "dd", "dt") else 1)
        if tag in ("h1", "h2", "h3", "h4", "h5", "h6") and md:
            self._emit("#" * int(tag[1]) + " ")
        elif tag in ("ul", "ol"):
            self.lists.append([tag == "ol", 1])
        elif tag == "li":
            indent = "  " * max(0, min(len(self.lists), _MAX_INDENT) - 1)
            if self.lists and self.lists[-1][0]:
                self._emit(f"{indent}{self.lists[-1][1]}. ")
                self.lists[-1][1] += 1
            else:
                self._emit(f"{indent}- ")
        elif tag == "br":
            self._emit("\n")
        elif tag == "hr" and md:
            self._emit("---")
            self._break(2)
        elif tag == "pre":
            self.pre += 1
            if md:
                self._emit("```\n")
        elif tag == "code" and md and not self.pre:
            self._emit("`")
        elif tag in ("strong", "b") and md:
            self._emit("**")
        elif tag in ("em", "i") and md:
            self._emit("*")
        elif tag == "a":
            href = dict(attrs).get("href")
            self.links.append(href if href and not href.startswith("javascript:") else None)
            if md and self.links[-1]:
                self._emit("[")
        elif tag == "img" and md:
            info = dict(attrs)
            if info.get("alt"):
                self._emit(f"![{info['alt']}]({info.get('src') or ''})")
        elif tag in ("td", "th"):
            self._emit(" | " if md else "\t")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in _HIDDEN:
            self.hidden = max(0, self.hidden - 1)
            return
        if self.hidden:
            return
        md = self.markdown
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
            if md:
                self._emit("\n```")
        elif tag == "code" and md and not self.pre:
            self._emit("`")
        elif tag in ("strong", "b") and md:
            self._emit("**")
        elif tag in ("em", "i") and md:
            self._emit("*")
        elif tag == "a" and self.links:
            href = self.links.pop()
            if href and md:
                self._emit(f"]({href})")
        elif tag in ("ul", "ol") and self.lists:
            self.lists.pop()
        if tag in _BLOCK:
            self._break(2 if tag not in ("li", "tr", "dd", "dt") else 1)

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title.append(data)
        if self.hidden:
            return
        if self.pre:
            self._emit(data)
            return
        text = _SPACE.sub(" ", data)
        if text.strip() or (self.out and not self.out[-1].endswith((" ", "\n"))):
            self._emit(text)

    def _emit(self, text: str) -> None:
        """Append to the output, keeping count of the newlines it ends with (each piece is
        looked at once: counting back through the output at every break would not be)."""
        if not text:
            return
        self.out.append(text)
        trailing = len(text) - len(text.rstrip("\n"))
        self.newlines = self.newlines + trailing if trailing == len(text) else trailing

    def _break(self, lines: int) -> None:
        """End the current line, with ``lines`` newlines at the end in all (not more)."""
        if self.out and self.newlines < lines:
            self._emit("\n" * (lines - self.newlines))

    def result(self) -> str:
        text = "".join(self.out)
        # per line, not re.sub(r"[ \t]+\n"): that regex retries a long run of spaces from each
        # of its characters when no newline follows (quadratic)
        text = "\n".join(line.rstrip(" \t") for line in text.split("\n"))
        text = re.sub(r"\n{3,}", "\n\n", text).strip()
        title = _SPACE.sub(" ", "".join(self.title)).strip()
        if title and self.markdown and not text.startswith("# "):
            text = f"# {title}\n\n{text}"
        elif title and not self.markdown:
            text = f"{title}\n\n{text}"
        return text


class _Tokenizer:
    """Hands the text and tags of a page to a converter, as the HTML standard splits them:
    tag and attribute names lowercased, character references decoded; comments, doctypes,
    processing instructions and the content of script and style dropped, and so is a tag (or
    comment) the page ends inside."""

    def __init__(self, html: str, sink: _Converter, deadline: float | None) -> None:
        self.html = html
        self.sink = sink
        self.deadline = deadline
        self.steps = 0
        self.tags: list[tuple[str, Attrs | None]] = []  # of the markup just read; None: end tag

    def run(self) -> None:
        html = self.html
        pos = text_from = 0
        while (lt := html.find("<", pos)) >= 0:
            self._tick()
            after = self._markup(lt)
            if after is None:  # a "<" that starts no markup is text
                pos = lt + 1
                continue
            self._text(text_from, lt)  # the text before the markup comes first
            for tag, attrs in self.tags:
                if attrs is None:
                    self.sink.handle_endtag(tag)
                else:
                    self.sink.handle_starttag(tag, attrs)
            self.tags.clear()
            pos = text_from = after
        self._text(text_from, len(html))

    def _tick(self) -> None:
        self.steps += 1
        if self.steps % _CHECK_EVERY or self.deadline is None:
            return
        if time.monotonic() > self.deadline:
            raise TimeoutError("converting the HTML page to text took too long")

    def _text(self, start: int, stop: int) -> None:
        if start < stop:
            self.sink.handle_data(unescape(self.html[start:stop]))

    def _markup(self, lt: int) -> int | None:
        """Read the markup at ``lt`` (a "<"): where it ends, or None when it is text."""
        html = self.html
        if html.startswith("<!--", lt):
            return self._comment(lt + 4)
        if html.startswith(("<!", "<?"), lt):  # doctype, CDATA, processing instruction
            return self._past_gt(lt + 2)
        if html.startswith("</", lt):
            return self._end_tag(lt + 2)
        name = _TAG_NAME.match(html, lt + 1)
        return None if name is None else self._start_tag(name)

    def _comment(self, start: int) -> int:
        html = self.html
        for abrupt in (">", "->"):  # "<!-->" and "<!--->" are whole (empty) comments
            if html.startswith(abrupt, start):
                return start + len(abrupt)
        close = html.find("-->", start)
        return len(html) if close < 0 else close + 3

    def _past_gt(self, start: int) -> int:
        close = self.html.find(">", start)
        return len(self.html) if close < 0 else close + 1

    def _end_tag(self, start: int) -> int | None:
        html = self.html
        name = _TAG_NAME.match(html, start)
        if name is None:
            if start >= len(html):
                return None  # "</" at the very end is text
            return self._past_gt(start)  # "</>" and "</ x>" are dropped
        close = html.find(">", name.end())
        if close < 0:
            return len(html)
        self.tags.append((name.group().lower(), None))
        return close + 1

    def _start_tag(self, name: re.Match[str]) -> int:
        html, end = self.html, len(self.html)
        tag = name.group().lower()
        attrs: Attrs = []
        pos = name.end()
        while True:
            self._tick()
            found = _ATTR_NAME.match(html, pos)
            assert found is not None  # every part of it is optional
            pos = found.end()
            if found.group(1) is None:  # at ">" or at the end of the page
                if pos >= end:
                    return end  # the page ends inside the tag: dropped
                self.tags.append((tag, attrs))
                if pos > found.start() and html[pos - 1] == "/":
                    self.tags.append((tag, None))  # "<br/>": a start and an end, as html.parser
                    return pos + 1
                return self._past_raw_text(tag, pos + 1)
            value, pos = self._attr_value(pos)
            if pos < 0:
                return end  # the page ends inside a quoted value: the tag is dropped
            attrs.append((found.group(1).lower(), value))

    def _attr_value(self, pos: int) -> tuple[str | None, int]:
        """The value after an attribute name at ``pos`` (None without "="), and where it ends
        (-1: a quote left open)."""
        html = self.html
        equals = _EQUALS.match(html, pos)
        if equals is None:
            return None, pos
        pos = equals.end()
        quote = html[pos : pos + 1]
        if quote in ('"', "'"):
            close = html.find(quote, pos + 1)
            if close < 0:
                return None, -1
            return unescape(html[pos + 1 : close]), close + 1
        unquoted = _UNQUOTED.match(html, pos)
        assert unquoted is not None  # it matches the empty string too
        return unescape(unquoted.group()), unquoted.end()

    def _past_raw_text(self, tag: str, start: int) -> int:
        """Where the markup after a start tag resumes: for script and style, past their content
        (to their end tag, or to the end of the page), which is never shown."""
        closing = _RAW_TEXT.get(tag)
        if closing is None:
            return start
        found = closing.search(self.html, start)
        return len(self.html) if found is None else found.start()


def html_to_text(
    html: str, mode: Literal["text", "markdown"] = "markdown", *, deadline: float | None = None
) -> str:
    """Readable text (``text``) or Markdown (``markdown``) of an HTML document.

    ``deadline`` (a ``time.monotonic()`` value): past it, ``TimeoutError`` is raised instead of
    converting the rest (the conversion may run on a thread that no one waits for any more).
    """
    converter = _Converter(markdown=mode == "markdown")
    _Tokenizer(html, converter, deadline).run()
    return converter.result()
