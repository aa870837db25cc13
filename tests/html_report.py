"""Reading the HTML capacity report back: its elements and the figure it hands to plotly."""

from __future__ import annotations

import json
from html.parser import HTMLParser


class Page(HTMLParser):
    """Scripts, the layout table's cells, the header's (label, text) pairs, the note on charts
    left out, the title, external references and every element's attributes of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self.external: list[str] = []
        self.rows: list[list[str]] = []
        """Cells (``td``) of each row of ``table#layouts``."""
        self.pairs: list[list[str]] = []
        """``[label, text]`` of each row of ``table.inputs`` (what was planned)."""
        self.missing: str | None = None
        """The text of ``p.missing`` (which charts are left out and what fills them)."""
        self.title = ""
        self.elements: list[tuple[str, dict[str, str]]] = []
        self._in: str | None = None
        self._table: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = {k: v or "" for k, v in attrs}
        self.elements.append((tag, attrs))
        if attrs.get("src") or (tag == "link" and attrs.get("href")):
            self.external.append(attrs.get("src") or attrs["href"])
        if tag == "table":
            self._table = attrs.get("id") or attrs.get("class")
        elif tag == "tr":
            if self._table == "layouts":
                self.rows.append([])
            elif self._table == "inputs":
                self.pairs.append([])
        elif tag in ("td", "th") and self._table == "inputs":
            self.pairs[-1].append("")
            self._in = "pair"
        elif tag == "td" and self._table == "layouts":
            self.rows[-1].append("")
            self._in = "td"
        elif tag == "script":
            self._in = "script"
            self.scripts.append("")
        elif tag == "p" and "missing" in attrs.get("class", "").split():
            self._in, self.missing = "missing", ""
        elif tag == "title":
            self._in = "title"

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        self._in = None

    def handle_data(self, data):
        if self._in == "script":
            self.scripts[-1] += data
        elif self._in == "td":
            self.rows[-1][-1] += data
        elif self._in == "pair":
            self.pairs[-1][-1] += data
        elif self._in == "missing":
            self.missing += data
        elif self._in == "title":
            self.title += data

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
