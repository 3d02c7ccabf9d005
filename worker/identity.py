"""Deterministic ids and the normalised entity key: the basis of idempotent writes and per-user scoping."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable

_SPACES = re.compile(r"\s+")
_SEP = "\x1f"  # unit separator: cannot appear in validated ids, so joined parts never collide


def _digest(*parts: str) -> str:
    return hashlib.sha256(_SEP.join(parts).encode("utf-8")).hexdigest()[:32]


def normalize_name(name: str) -> str:
    """The key entities merge on: NFKC (full-width → half-width), case-folded, white space collapsed."""
    return _SPACES.sub(" ", unicodedata.normalize("NFKC", name).casefold()).strip()


def entity_key(name: str) -> str:
    """What entities merge on (their uid is made of it and the user id)."""
    return normalize_name(name) or name.strip()


def entity_uid(user_id: str, key: str) -> str:
    """Entities are per user: the same name for two users is two entities."""
    return "ent_" + _digest("entity", user_id, key)


def user_tag(user_id: str) -> str:
    """A single Lucene token standing for the user, so fulltext queries are narrowed to one user's documents.

    The exact `user_id` property is still checked in Cypher; the tag only makes the index do less work.
    """
    return "u" + _digest("user", user_id)


def derive_episode_id(user_id: str, session_id: str, messages: Iterable[tuple[str, str]]) -> str:
    """Same user, session and messages → same id, so a conversation sent twice is stored once."""
    canonical = json.dumps([[role, content] for role, content in messages], ensure_ascii=False)
    return "ep_" + _digest("episode", user_id, session_id, canonical)
