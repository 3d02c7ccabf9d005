"""The fields of the service's log records (the `extra` the code passes: ids, counts, error classes; never
conversation or query text, which no call puts there) written on each line as JSON.

Celery sets up logging in the worker processes with its own format, which shows no such fields: a filter on
its handlers appends them to the lines of the service's loggers. uvicorn (memctl serve) and the MCP server
set up only their own loggers, so the root logger stays at WARNING with no handler and the audit records
would be dropped: those processes get a stderr handler on the service's loggers instead.
"""

from __future__ import annotations

import json
import logging
import sys

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
_MARK = "_memory_fields"
OURS = ("memory", "worker", "tasks", "api_stub")  # the service's loggers: named memory.*, or by module


def fields(record: logging.LogRecord) -> str:
    """` {"field": value, ...}` for a record of the service's loggers that has fields, else ''."""
    if record.name.split(".", 1)[0] not in OURS:
        return ""
    extra = {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}
    return f" {json.dumps(extra, default=str, ensure_ascii=False)}" if extra else ""


class FieldsFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return super().format(record) + fields(record)


class FieldsFilter(logging.Filter):
    """For a handler whose formatter is someone else's (Celery's): the fields go on the message itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        suffix = fields(record)
        if suffix and not getattr(record, _MARK, False):
            record.msg, record.args = record.getMessage() + suffix, None
            setattr(record, _MARK, True)  # once, however many handlers see the record
        return True


def add_fields_to(logger: logging.Logger) -> None:
    """Idempotent: the filter on each of the logger's handlers."""
    for handler in logger.handlers:
        if not any(isinstance(f, FieldsFilter) for f in handler.filters):
            handler.addFilter(FieldsFilter())


def log_to_stderr(level: int = logging.INFO) -> None:
    """Idempotent: one stderr handler for the service's loggers, which no longer hand records to the root."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FieldsFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    setattr(handler, _MARK, True)
    for name in OURS:
        logger = logging.getLogger(name)
        if not any(getattr(h, _MARK, False) for h in logger.handlers):
            logger.addHandler(handler)
            logger.setLevel(level)
            logger.propagate = False
