"""Pieces of one self-contained HTML page: every text escaped with the standard library's
`html.escape`, the style sheet inline, figures as `data:` URIs, nothing fetched from anywhere
(no script, font, stylesheet or image link), so the file opens offline and can be mailed."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path

# System fonts only: a web font would be a network fetch.
CSS = """
:root { color-scheme: light; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
  color: #1b1b1b; background: #fff; margin: 0 auto; padding: 1.5em 1.5em 4em; max-width: 1040px; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
h3 { font-size: 1.05em; margin-top: 1.5em; }
.subtitle { color: #555; margin-top: 0; }
ul.verdicts { padding-left: 1.2em; }
ul.verdicts li { margin: 0.45em 0; }
.verdict-pass { color: #00704f; font-weight: 600; }
.verdict-fail { color: #b34700; font-weight: 600; }
.absent { color: #6b5900; background: #fff8d6; border-left: 4px solid #e6c200;
  padding: 0.4em 0.8em; margin: 0.8em 0; }
figure { margin: 1.2em 0 2em; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #333; font-size: 0.93em; max-width: 760px; margin-top: 0.4em; }
table { border-collapse: collapse; margin: 0.6em 0 0.4em; font-size: 0.9em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.7em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f4f4f4; }
caption { caption-side: top; text-align: left; font-weight: 600; padding-bottom: 0.3em; }
dl.defs { font-size: 0.88em; color: #333; margin: 0.2em 0 1.4em; }
dl.defs dt { font-family: ui-monospace, "DejaVu Sans Mono", monospace; float: left;
  clear: left; min-width: 11em; }
dl.defs dd { margin-left: 12em; }
pre, code { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 0.88em; }
pre { background: #f6f6f6; padding: 0.6em 0.8em; overflow-x: auto; white-space: pre-wrap;
  word-break: break-all; }
"""


def text(value: object) -> str:
    """Escaped text (quotes too, so the result is also safe inside an attribute)."""
    return escape(str(value), quote=True)


def element(name: str, body: str = "", **attrs: str) -> str:
    """`<name attrs>body</name>`; `body` is already HTML, attribute values are escaped.
    A trailing underscore in an attribute name is dropped (`class_` → `class`)."""
    attributes = "".join(f' {k.rstrip("_")}="{text(v)}"' for k, v in attrs.items())
    return f"<{name}{attributes}>{body}</{name}>"


def paragraph(value: str, **attrs: str) -> str:
    return element("p", text(value), **attrs)


def bullet_list(items: Iterable[str], **attrs: str) -> str:
    """A `<ul>` of items that are already HTML."""
    return element("ul", "".join(element("li", item) for item in items), **attrs)


def table(header: Sequence[str], rows: Iterable[Sequence[object]], caption: str = "") -> str:
    """A plain table of escaped cells (None shows as an em dash)."""
    head = element("tr", "".join(element("th", text(h)) for h in header))
    body = "".join(
        element("tr", "".join(element("td", text("—" if c is None else c)) for c in row))
        for row in rows
    )
    cap = element("caption", text(caption)) if caption else ""
    return element("table", cap + element("thead", head) + element("tbody", body))


def definitions(items: Iterable[tuple[str, str]]) -> str:
    """The units and definitions printed beside a table: `term: meaning` pairs."""
    body = "".join(
        element("dt", text(term)) + element("dd", text(meaning)) for term, meaning in items
    )
    return element("dl", body, class_="defs")


def _png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def figure(path: Path, alt: str, caption: str) -> str:
    """A PNG embedded as a data URI with its caption."""
    img = f'<img src="{_png_data_uri(path)}" alt="{text(alt)}">'
    return element("figure", img + element("figcaption", text(caption)))


def code_block(value: str) -> str:
    return element("pre", element("code", text(value)))


def page(title: str, subtitle: str, body: str) -> str:
    """The whole document: UTF-8, the inline style sheet, no external resource."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{text(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"{element('h1', text(title))}\n{paragraph(subtitle, class_='subtitle')}\n{body}\n"
        "</body>\n</html>\n"
    )
