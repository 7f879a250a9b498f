"""Log output for people (text) or for log shippers (one JSON object per line).

One record is one line in either format, whatever its values hold: control characters in
a message (and in the access log's fields) are written as escapes (``router.observability
.escape``), so a client or an upstream cannot forge or rewrite a line. A traceback, the
one thing that spans lines, has each of its lines indented in the text format (nothing it
quotes can start a line of its own) and stays inside one JSON string in the JSON format.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from types import TracebackType
from typing import Literal

import orjson

from router.observability.escape import escape_controls, escape_controls_but_newlines

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
TRACE_INDENT = "  "
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        # Another handler may have cached its own (unindented) traceback on the record.
        cached, record.exc_text = record.exc_text, None
        try:
            return super().format(record)
        finally:
            record.exc_text = cached

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: ExcInfo) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(trace: str) -> str:
    return "\n".join(
        TRACE_INDENT + line for line in escape_controls_but_newlines(trace).split("\n")
    )


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message"}`` plus, for an access-log line, its fields
    (``client``, ``status``, ``duration_ms``...) as top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": escape_controls(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            data.update(
                {
                    k: escape_controls(v) if isinstance(v, str) else v
                    for k, v in fields.items()
                    if k not in data
                }
            )
        if record.exc_info:
            data["exception"] = escape_controls_but_newlines(self.formatException(record.exc_info))
        return orjson.dumps(data, default=str).decode()


def formatter(fmt: LogFormat) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else TextFormatter()


def setup_logging(level: str, fmt: LogFormat = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # ours is speclane.access
