"""HTML as readable text or Markdown, for the http_request tool (standard library only).

Scripts, styles and other invisible parts are dropped; headings, paragraphs, lists, links,
emphasis, code and preformatted blocks are kept as Markdown (or as plain text in text mode).
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Literal

__all__ = ["html_to_text"]

_HIDDEN = {"script", "style", "noscript", "template", "svg", "head", "iframe", "object", "canvas"}
_BLOCK = {
    "p", "div", "section", "article", "header", "footer", "main", "nav", "aside", "ul", "ol",
    "table", "tr", "blockquote", "figure", "figcaption", "form", "dl", "dt", "dd", "address",
    "details", "summary", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "hr", "li",
}  # fmt: skip
_SPACE = re.compile(r"[ \t\r\n\f\v]+")


class _Converter(HTMLParser):
    def __init__(self, markdown: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.markdown = markdown
        self.out: list[str] = []
        self.hidden = 0
        self.pre = 0
        self.lists: list[list[int]] = []  # per open list: [is_ordered, next number]
        self.links: list[str | None] = []
        self.title: str = ""
        self._in_title = False

    # -- tags ------------------------------------------------------------------------------------

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
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
            self.out.append("#" * int(tag[1]) + " ")
        elif tag in ("ul", "ol"):
            self.lists.append([tag == "ol", 1])
        elif tag == "li":
            indent = "  " * max(0, len(self.lists) - 1)
            if self.lists and self.lists[-1][0]:
                self.out.append(f"{indent}{self.lists[-1][1]}. ")
                self.lists[-1][1] += 1
            else:
                self.out.append(f"{indent}- ")
        elif tag == "br":
            self.out.append("\n")
        elif tag == "hr" and md:
            self.out.append("---")
            self._break(2)
        elif tag == "pre":
            self.pre += 1
            if md:
                self.out.append("```\n")
        elif tag == "code" and md and not self.pre:
            self.out.append("`")
        elif tag in ("strong", "b") and md:
            self.out.append("**")
        elif tag in ("em", "i") and md:
            self.out.append("*")
        elif tag == "a":
            href = dict(attrs).get("href")
            self.links.append(href if href and not href.startswith("javascript:") else None)
            if md and self.links[-1]:
                self.out.append("[")
        elif tag == "img" and md:
            info = dict(attrs)
            if info.get("alt"):
                self.out.append(f"![{info['alt']}]({info.get('src') or ''})")
        elif tag in ("td", "th"):
            self.out.append(" | " if md else "\t")

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
                self.out.append("\n```")
        elif tag == "code" and md and not self.pre:
            self.out.append("`")
        elif tag in ("strong", "b") and md:
            self.out.append("**")
        elif tag in ("em", "i") and md:
            self.out.append("*")
        elif tag == "a" and self.links:
            href = self.links.pop()
            if href and md:
                self.out.append(f"]({href})")
        elif tag in ("ul", "ol") and self.lists:
            self.lists.pop()
        if tag in _BLOCK:
            self._break(2 if tag not in ("li", "tr", "dd", "dt") else 1)

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        if self.hidden:
            return
        if self.pre:
            self.out.append(data)
            return
        text = _SPACE.sub(" ", data)
        if text.strip() or (self.out and not self.out[-1].endswith((" ", "\n"))):
            self.out.append(text)

    def _break(self, lines: int) -> None:
        """End the current line, with ``lines`` newlines at the end in all (not more)."""
        tail = "".join(self.out[-4:])
        have = len(tail) - len(tail.rstrip("\n"))
        if self.out and have < lines:
            self.out.append("\n" * (lines - have))

    def result(self) -> str:
        text = "".join(self.out)
        text = re.sub(r"[ \t]+\n", "\n", text)
        text = re.sub(r"\n{3,}", "\n\n", text).strip()
        title = _SPACE.sub(" ", self.title).strip()
        if title and self.markdown and not text.startswith("# "):
            text = f"# {title}\n\n{text}"
        elif title and not self.markdown:
            text = f"{title}\n\n{text}"
        return text


def html_to_text(html: str, mode: Literal["text", "markdown"] = "markdown") -> str:
    """Readable text (``text``) or Markdown (``markdown``) of an HTML document."""
    converter = _Converter(markdown=mode == "markdown")
    converter.feed(html)
    converter.close()
    return converter.result()
