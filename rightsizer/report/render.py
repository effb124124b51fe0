"""The report's sections (:mod:`rightsizer.report.sections`) as HTML and as Markdown: two small
renderers of one model, so both files always show the same sections and numbers."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from html import escape

from rightsizer.report.sections import Document, Section, Table


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


CSS = """
:root { --ink:#1f2933; --muted:#616e7c; --line:#e4e7eb; --bg:#f5f7fa; --accent:#2f9e6e; --warn:#c17d11; --bad:#d64545; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink); font:15px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 32px 28px 56px; }
header h1 { font-size: 28px; margin: 0 0 4px; letter-spacing: -0.01em; }
header p { margin: 0; color: var(--muted); }
.cards { display:grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr)); gap:14px; margin: 24px 0 8px; }
.card { background:#fff; border:1px solid var(--line); border-radius:10px; padding:14px 16px; }
.card .v { font-size: 28px; font-weight: 650; line-height:1.15; }
.card .k { color: var(--muted); font-size: 13px; }
.card.good .v { color: var(--accent); } .card.warn .v { color: var(--warn); } .card.bad .v { color: var(--bad); }
section { background:#fff; border:1px solid var(--line); border-radius:10px; padding: 20px 22px; margin-top: 20px; }
section h2 { font-size: 19px; margin: 0 0 6px; }
section p.lead { margin: 0 0 14px; color: var(--muted); }
img { width: 100%; display:block; margin: 8px 0 4px; }
table { border-collapse: collapse; width: 100%; font-size: 13.5px; margin-top: 10px; }
th { text-align:left; font-weight:600; color: var(--muted); border-bottom: 2px solid var(--line); padding: 7px 8px; white-space: nowrap; }
td { border-bottom: 1px solid var(--line); padding: 7px 8px; vertical-align: top; }
td.k { white-space: nowrap; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code { background: var(--bg); border:1px solid var(--line); border-radius: 4px; padding: 1px 5px; font-size: 12.5px; }
.sev-critical { color: var(--bad); font-weight:600; } .sev-warning { color: var(--warn); font-weight:600; }
footer { color: var(--muted); font-size: 12.5px; margin-top: 26px; }
ul.notes { margin: 6px 0 0; padding-left: 20px; color: var(--muted); }
"""


_CODE = re.compile(r"`([^`]+)`")


def _inline(text: str) -> str:
    """Escaped HTML with `code` spans."""
    return _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", escape(text, quote=False))


def _html_table(t: Table) -> list[str]:
    def cls(i: int) -> str:
        return " class='n'" if i in t.numeric else " class='k'" if i == 0 else ""

    out = ["<table><tr>", *(f"<th{cls(i)}>{escape(h)}</th>" for i, h in enumerate(t.headers)), "</tr>"]
    out += [
        "<tr>" + "".join(f"<td{cls(i)}>{escape(v)}</td>" for i, v in enumerate(row)) + "</tr>"
        for row in t.rows
    ]
    out.append("</table>")
    return out


def _html_section(s: Section, charts: Mapping[str, bytes]) -> list[str]:
    out = [f"<section id='{escape(s.key)}'><h2>{escape(s.title)}</h2>"]
    if s.lead:
        out.append(f"<p class='lead'>{_inline(s.lead)}</p>")
    if s.image and s.image in charts:
        out.append(f'<img alt="{escape(s.title)}" src="{data_uri(charts[s.image])}">')
    if s.table is not None:
        out += _html_table(s.table)
    if s.notes:
        out += ["<ul class='notes'>", *(f"<li>{_inline(n)}</li>" for n in s.notes), "</ul>"]
    if s.after:
        out.append(f"<p class='lead'>{_inline(s.after)}</p>")
    out.append("</section>")
    return out


def html(doc: Document, charts: Mapping[str, bytes]) -> str:
    """A self-contained page: the charts inlined as data URIs."""
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{escape(doc.title)} {escape(doc.subtitle.split(' (')[0])}</title>",
        f"<style>{CSS}</style></head><body><main>",
        f"<header><h1>{escape(doc.title)}</h1><p>{_inline(doc.subtitle)}</p></header>",
        "<div class='cards'>",
        *(
            f"<div class='card {c.tone}'><div class='v'>{escape(c.value)}</div><div class='k'>{escape(c.label)}</div></div>"
            for c in doc.cards
        ),
        "</div>",
    ]
    for s in doc.sections:
        out += _html_section(s, charts)
    out += [f"<footer>{_inline(doc.footer)}</footer>", "</main></body></html>"]
    return "\n".join(out) + "\n"


def _md_table(t: Table) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    return [
        "| " + " | ".join(t.headers) + " |",
        "|" + "|".join("---:" if i in t.numeric else "---" for i in range(len(t.headers))) + "|",
        *("| " + " | ".join(cell(c) for c in row) + " |" for row in t.rows),
    ]


def markdown(doc: Document) -> str:
    """The same document in Markdown, the charts referenced as the PNG files beside it."""
    out = [f"# {doc.title}", "", doc.subtitle, "", *(f"- **{c.value}** {c.label}" for c in doc.cards), ""]
    for s in doc.sections:
        out += [f"## {s.title}", ""]
        if s.lead:
            out += [s.lead, ""]
        if s.image:
            out += [f"![{s.title}]({s.image})", ""]
        if s.table is not None:
            out += [*_md_table(s.table), ""]
        if s.notes:
            out += [*(f"- {n}" for n in s.notes), ""]
        if s.after:
            out += [s.after, ""]
    out += [doc.footer]
    return "\n".join(out) + "\n"
