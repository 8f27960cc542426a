"""How the commands log: one line of text per record, or one JSON object per line.

``--log-format json`` (``CODEDGD_LOG_FORMAT=json``) suits log shippers (Loki, CloudWatch,
Elasticsearch): each record is an object with ``time`` (UTC, ISO 8601), ``level``,
``logger`` and ``message`` (and ``exception`` with its traceback when there is one).
Whatever a message holds, a record stays one line: JSON escapes newlines.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """A log record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure(level: int, fmt: str) -> None:
    """Log to stderr at ``level`` in format ``fmt`` (one of :data:`FORMATS`)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
