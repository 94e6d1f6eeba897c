"""Tables a cell prints, as HTML tables: in Jupyter and in the built book alike.

The studies and estimates write their tables as Markdown pipe tables, the form their records in
``benchmarks/results`` keep. A Markdown string handed to ``display(Markdown(...))`` is not a table in the built book
(myst-nb publishes it as a paragraph of pipes), so a chapter shows one with :func:`show_table`, which turns it into
an HTML ``<table>`` and displays that; ``tests/test_browser.py`` fails on a built page that still holds a paragraph of
pipes.

Example::

    from dit_book import show_table
    show_table(findings.format_scaling_table(rows))     # a Markdown pipe table, shown as an HTML table
"""

from __future__ import annotations

import html
import re

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_EMPH = re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])")
_RULE = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?$")


def _inline(text: str) -> str:
    """A cell's text as HTML: escaped, with `code`, **bold** and *emphasis* kept as such."""
    parts = _CODE.split(text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # inside backticks: literal
            out.append(f"<code>{html.escape(part)}</code>")
        else:
            part = html.escape(part)
            part = _BOLD.sub(r"<strong>\1</strong>", part)
            out.append(_EMPH.sub(r"<em>\1</em>", part))
    return "".join(out)


def _cells(line: str) -> list[str]:
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)]


def is_pipe_table(lines: list[str]) -> bool:
    """Whether ``lines`` open with a Markdown pipe table: a row of cells and a rule of dashes under it."""
    return len(lines) >= 2 and lines[0].strip().startswith("|") and bool(_RULE.match(lines[1].strip()))


def markdown_to_html(text: str) -> str:
    """Markdown made of pipe tables and plain paragraphs (what the studies print) as HTML: each table a
    ``<table>``, with right-aligned columns where the rule says ``---:``, each other block of lines a ``<p>``."""
    blocks: list[str] = []
    lines = text.strip("\n").splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        if is_pipe_table(lines[i:]):
            head = _cells(lines[i])
            align = ["right" if c.endswith(":") and not c.startswith(":") else
                     "center" if c.startswith(":") and c.endswith(":") else None for c in _cells(lines[i + 1])]
            i += 2
            rows = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1

            def cell(tag, text, k):
                style = f' style="text-align: {align[k]}"' if k < len(align) and align[k] else ""
                return f"<{tag}{style}>{_inline(text)}</{tag}>"

            body = "".join("<tr>" + "".join(cell("td", c, k) for k, c in enumerate(r)) + "</tr>" for r in rows)
            blocks.append('<table class="dit-table"><thead><tr>' + "".join(cell("th", c, k) for k, c in enumerate(head))
                          + f"</tr></thead><tbody>{body}</tbody></table>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not is_pipe_table(lines[i:]):
                para.append(lines[i].strip())
                i += 1
            blocks.append(f"<p>{_inline(' '.join(para))}</p>")
    return "\n".join(blocks)


class Table:
    """A Markdown table that shows as HTML in a notebook (``_repr_html_``) and as its Markdown text elsewhere."""

    def __init__(self, markdown: str):
        self.markdown = markdown

    def _repr_html_(self) -> str:
        return markdown_to_html(self.markdown)

    def __repr__(self) -> str:
        return self.markdown


def show_table(markdown: str) -> Table:
    """Display a Markdown pipe table (and any paragraphs around it) as an HTML table; returns the :class:`Table`."""
    from IPython.display import display

    table = Table(markdown)
    display(table)
    return table


_PIPE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_PIPE_RULE = re.compile(r"\|\s*:?-{3,}:?\s*\|")


def pipe_tables_in_html(page: str) -> list[str]:
    """The Markdown pipe tables that a built page shows as text instead of as tables: a paragraph (``<p>``) or a
    printed output (``<pre>``) holding a row of cells over a ``|---|`` rule. Returns the start of each, for the
    message of a failing check (``tests/test_browser.py``)."""
    from bs4 import BeautifulSoup

    found = []
    for element in BeautifulSoup(page, "html.parser").find_all(["p", "pre"]):
        text = element.get_text()
        lines = [line for line in text.splitlines() if line.strip()]
        rows = [line for line in lines if _PIPE_ROW.match(line)]
        if _PIPE_RULE.search(text.replace("\n", " ")) and (len(rows) >= 2 or element.name == "p"):
            found.append(" ".join(text.split())[:120])
    return found
