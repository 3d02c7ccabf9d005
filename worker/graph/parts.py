"""What Neo4jGraphStore gives the parts it is made of (erase.py, portable.py, reextract.py): sessions and
write transactions with its timeouts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from neo4j import Session

T = TypeVar("T")


class StorePart:
    def _session(self) -> Session:
        raise NotImplementedError

    def _read_session(self) -> Session:
        raise NotImplementedError

    def _write(self, session: Session, work: Callable[..., T], *args: Any, bulk: bool = False) -> T:
        raise NotImplementedError
