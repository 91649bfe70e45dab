"""report.md as report.html: one self-contained page (headings, bullets, tables, paragraphs, and the
PNG plots inlined as data URLs), so a report can be mailed or archived as one file."""

from __future__ import annotations

import base64
import html
import os
import re

from lowband.atomic import write_text_atomic


def write_html(path: str, md: list[str], folder: str) -> None:
    """report.md's lines as HTML (headings, bullets, tables, images inlined, paragraphs)."""
    parts, table_rows = [], []
    for line in md + [""]:
        if line.startswith("|"):
            if "---|" not in line:
                table_rows.append([html.escape(c.strip()) for c in line.strip().strip("|").split("|")])
            continue
        if table_rows:
            head, *body = table_rows
            parts.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in head) + "</tr>"
                         + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in body) + "</table>")
            table_rows = []
        parts.append(_html_line(line, folder))
    page = ("<!doctype html><meta charset='utf-8'><title>lowband comparison</title>"
            "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child{text-align:left}"
            "img{max-width:100%;display:block;margin:1em 0}</style>" + "".join(parts))
    write_text_atomic(path, page)


def _html_line(line: str, folder: str) -> str:
    image = re.fullmatch(r"!\[(\w+)\]\((\S+)\)", line)
    if image:
        with open(os.path.join(folder, image.group(2)), "rb") as f:
            data = base64.b64encode(f.read()).decode()
        return f'<img alt="{image.group(1)}" src="data:image/png;base64,{data}">'
    level = len(line) - len(line.lstrip("#"))
    if level:
        return f"<h{level}>{html.escape(line[level:].strip())}</h{level}>"
    if line.startswith("- "):
        return f"<li>{html.escape(line[2:])}</li>"
    return f"<p>{html.escape(line)}</p>" if line else ""
