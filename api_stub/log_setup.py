"""Logging for the processes memctl serves from itself (the HTTP facade, the MCP server): the service's own
`memory.*` loggers (audit records included) go to stderr at INFO, each line with the record's fields.

Celery sets up logging in the worker processes; uvicorn sets up only its own loggers, so without this the
root logger stays at WARNING with no handler and the audit records are dropped. The fields are the `extra`
the code passes (ids, counts, error classes): never conversation or query text, which no call puts there.
"""

from __future__ import annotations

import json
import logging
import sys

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class _FieldsFormatter(logging.Formatter):
    """`time level logger message {"field": value, ...}`."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}
        return f"{line} {json.dumps(fields, default=str, ensure_ascii=False)}" if fields else line


def log_to_stderr(level: int = logging.INFO) -> None:
    """Idempotent: one handler on the `memory` logger."""
    logger = logging.getLogger("memory")
    if any(getattr(h, "_memory_fields", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_FieldsFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    handler._memory_fields = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False  # the root logger (uvicorn's or none) would print the record a second time
