"""Markdown that shows text as text (summary.md and the gate's --markdown output).

GitHub renders HTML inside markdown, so ``<``, ``>`` and ``&`` become entities; ``|`` would
end a table cell and markdown punctuation would format, so both are backslash-escaped.
"""
from __future__ import annotations

_MARKDOWN_PUNCTUATION = "\\`*_[]#~"


def md_text(text: str) -> str:
    """``text`` on one line, shown literally in a markdown paragraph or table cell."""
    out = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for char in _MARKDOWN_PUNCTUATION:
        out = out.replace(char, "\\" + char)
    out = out.replace("|", "\\|")
    return " ".join(out.split())


def md_code(text: str) -> str:
    """``text`` as an inline code span (case ids), safe inside a table cell."""
    text = " ".join(text.split()).replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"


def md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Lines of a markdown table; cells must already be escaped."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines
