"""The fields of the service's log records (the `extra` the code passes: ids, counts, error classes; never
conversation or query text, which no call puts there) written on each line as JSON.

Celery sets up logging in the worker processes with its own format, which shows no such fields: its
handlers' formatters are wrapped to append them to the lines of the service's loggers. uvicorn (memctl
serve) and the MCP server set up only their own loggers, so the root logger stays at WARNING with no handler
and the audit records would be dropped: those processes get a stderr handler on the service's loggers.
"""

from __future__ import annotations

import json
import logging
import sys

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
_MARK = "_memory_fields"  # on the stderr handler of log_to_stderr
OURS = ("memory", "worker", "tasks", "api_stub")  # the service's loggers: named memory.*, or by module


def fields(record: logging.LogRecord) -> str:
    """` {"field": value, ...}` for a record of the service's loggers that has fields, else ''."""
    if record.name.split(".", 1)[0] not in OURS:
        return ""
    extra = {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}
    return f" {json.dumps(extra, default=str, ensure_ascii=False)}" if extra else ""


class _WithFields(logging.Formatter):
    """A formatter (Celery's, or ours) with the fields after its line; the record is left as it is."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return self.inner.format(record) + fields(record)


def add_fields_to(logger: logging.Logger) -> None:
    """Idempotent: each of the logger's handlers writes the fields after its own line."""
    for handler in logger.handlers:
        if not isinstance(handler.formatter, _WithFields):
            handler.setFormatter(_WithFields(handler.formatter or logging.Formatter()))


def log_to_stderr(level: int = logging.INFO) -> None:
    """Idempotent: one stderr handler for the service's loggers, which no longer hand records to the root."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_WithFields(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")))
    setattr(handler, _MARK, True)
    for name in OURS:
        logger = logging.getLogger(name)
        if not any(getattr(h, _MARK, False) for h in logger.handlers):
            logger.addHandler(handler)
            logger.setLevel(level)
            logger.propagate = False
