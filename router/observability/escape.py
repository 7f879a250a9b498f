"""Control characters out of log lines: a value a client or an upstream chose (a model
name, a header, an upstream's error message) must not start a line of its own choosing,
rewrite the one it is on (CR, escape sequences) or hide in it.

A leaf (it imports nothing of speclane's), so the access log can escape its fields where it
formats them and the log formatters can escape every message.
"""

from __future__ import annotations

import re

# C0, DEL and C1 controls, and the Unicode line and paragraph separators that some log
# viewers and JSON consumers break lines on.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_BUT_LF = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    c = match.group()
    named = _NAMED.get(c)
    if named is not None:
        return named
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control character written as a visible escape (``\\n``,
    ``\\x1b``, ``\\u2028``); text without any is returned as it is."""
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(_escaped, text)


def escape_controls_but_newlines(text: str) -> str:
    """For a traceback: its line breaks stay (the formatter indents what follows them)."""
    if _CONTROL_BUT_LF.search(text) is None:
        return text
    return _CONTROL_BUT_LF.sub(_escaped, text)
