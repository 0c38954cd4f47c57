"""Text that cannot break anything: every message is made valid, printable text when it is
recorded, and every output shows it through the same escaping.

Compiler output decoded with ``errors="surrogateescape"`` carries lone surrogates (``\udc80``),
which UTF-8 cannot encode: one of them used to cost the whole report. NUL, ESC and terminal
title sequences pass raw into a terminal, a Markdown file or the gate's output. Both are
shown as Python escapes (``\udc80``, ``\x1b``), readable and reversible by eye.
"""
from __future__ import annotations

import re
from typing import Any

# Lone surrogates; C0 controls except tab and newline; DEL and C1 controls; Unicode's
# bidirectional overrides and isolates (which reorder what a terminal or page shows).
_UNSAFE = re.compile("[\ud800-\udfff\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# The same, with tab and newline: for text that must stay on one line.
_UNSAFE_ONE_LINE = re.compile("[\ud800-\udfff\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _as_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    return value if isinstance(value, str) else str(value)


def clean_text(value: Any) -> str:
    """``value`` as valid, printable text (newlines and tabs kept; see the module doc)."""
    return _UNSAFE.sub(_escape, _as_text(value))


def one_line(value: Any) -> str:
    """``clean_text`` with newlines and tabs escaped too: a field on one line of output."""
    return _UNSAFE_ONE_LINE.sub(_escape, clean_text(value))


def first_line(value: Any, limit: int | None = None) -> str:
    """The first non-empty line of a message, made safe for one line of output and cut to
    ``limit`` characters (with an ellipsis) when given. A line that only introduces the next
    (Dynamo wraps a compiler's error as ``backend='inductor' raised:``, the error itself on the
    next line) comes with that one."""
    text = clean_text(_as_text(value).replace("\r\n", "\n"))  # a CR of CRLF is no content
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else ""
    if line.endswith(":") and len(lines) > 1:
        line = f"{line} {lines[1]}"
    line = one_line(line)
    if limit is None or len(line) <= limit:
        return line
    return line[: limit - 1] + "…"


def clean_json(value: Any) -> Any:
    """Every string in a JSON value (keys too) cleaned with ``clean_text``."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    return value
