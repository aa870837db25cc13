"""Reading the HTML capacity report back: its elements and the figure it hands to plotly."""

from __future__ import annotations

import json
from html.parser import HTMLParser


class Page(HTMLParser):
    """Scripts, table cells, external references and every element's attributes of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self.external: list[str] = []
        self.rows: list[list[str]] = []
        self.elements: list[tuple[str, dict[str, str]]] = []
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = {k: v or "" for k, v in attrs}
        self.elements.append((tag, attrs))
        if tag == "script":
            self._in = "script"
            self.scripts.append("")
        if attrs.get("src") or (tag == "link" and attrs.get("href")):
            self.external.append(attrs.get("src") or attrs["href"])
        if tag == "tr":
            self.rows.append([])
        if tag == "td":
            self._in = "td"

    def handle_endtag(self, tag):
        self._in = None

    def handle_data(self, data):
        if self._in == "script":
            self.scripts[-1] += data
        elif self._in == "td":
            self.rows[-1].append(data)

    def with_class(self, tag: str, classes: str) -> list[dict[str, str]]:
        """Attributes of the ``tag`` elements that have all of ``classes`` (space-separated)."""
        wanted = set(classes.split())
        return [
            a for t, a in self.elements if t == tag and wanted <= set(a.get("class", "").split())
        ]


def read_page(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


def figure(page: Page) -> dict:
    """The data and layout the page passes to ``Plotly.newPlot("charts", data, layout)``."""
    script = next(s for s in page.scripts if "Plotly.newPlot" in s)
    start = script.index('"charts",') + len('"charts",')
    decoder = json.JSONDecoder()
    rest = script[start:].lstrip()
    data, end = decoder.raw_decode(rest)
    layout, _ = decoder.raw_decode(rest[end:].lstrip().lstrip(",").lstrip())
    return {"data": data, "layout": layout}
