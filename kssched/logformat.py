"""Log formatting: one JSON object per line when KSSCHED_LOG_FORMAT=json.

Log collectors (Loki, Elasticsearch, Cloud Logging) read one record per line; a
traceback or a message with newlines stays inside its record's JSON string.
"""

import json
import logging
import logging.config
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else was passed with `extra=` and is kept.
_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """Format a record as `{"time", "level", "logger", "message", ...}` on one line.

    `time` is ISO 8601 in UTC with milliseconds. An exception adds `exc_info` (the
    formatted traceback); values passed with `extra=` are added under their own
    names, converted with `str()` when JSON cannot encode them.
    """

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure(config: dict[str, Any]) -> None:
    """LOGGING_CONFIG: apply the LOGGING dict, and send Python warnings (deprecations,
    library notices) through logging, so they come out in the chosen format too."""
    logging.config.dictConfig(config)
    logging.captureWarnings(True)
