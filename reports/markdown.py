"""Markdown that shows text as text (summary.md and the gate's --markdown output).

GitHub renders HTML inside markdown, so ``<``, ``>`` and ``&`` become entities; ``|`` would
end a table cell and markdown punctuation would format, so both are backslash-escaped.
"""
from __future__ import annotations

import re

from records.text import one_line

_MARKDOWN_PUNCTUATION = "\\`*_[]#~"


def md_text(text: str) -> str:
    """``text`` on one line, shown literally in a markdown paragraph or table cell (control
    characters shown as escapes, ``\x1b``)."""
    out = one_line(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for char in _MARKDOWN_PUNCTUATION:
        out = out.replace(char, "\\" + char)
    out = out.replace("|", "\\|")
    return " ".join(out.split())


def md_code(text: str) -> str:
    """``text`` as an inline code span (case ids), safe inside a table cell, whatever
    backticks it holds (CommonMark: a fence longer than any run of backticks inside it,
    padded with a space when the text starts or ends with one)."""
    text = " ".join(one_line(text).split()).replace("|", "\\|")
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if longest else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Lines of a markdown table; cells must already be escaped."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines
