"""The recall relevance set (tests/data/relevance.json): load it, store it through the real write path
(offline extraction + the Neo4j store), and measure recall@k with any recall function."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.graph.neo4j_store import Neo4jGraphStore
from worker.models import Limits, MemoryContext, build_episode
from worker.pipeline import episode_payload, extract_stage, persist_stage
from worker.settings import Settings

DATA = Path(__file__).resolve().parent / "data" / "relevance.json"


@dataclass(frozen=True)
class Query:
    user: str
    text: str
    answers: frozenset[str]  # keys of the episodes that answer it
    alone: str | None = None  # a chatty query: the question without its small talk


@dataclass(frozen=True)
class Dataset:
    episodes: list[dict[str, Any]]
    queries: list[Query]
    paraphrases: list[Query]  # share no search term with their answers (for embeddings)
    twins: list[Query]  # one user, a dozen episodes of one frame ("my boss's …"): the answer must rank first
    chatty: list[Query]  # lexical and near-twin queries again, after two to four sentences of small talk

    @property
    def users(self) -> list[str]:
        return sorted({e["user"] for e in self.episodes})


def load_dataset() -> Dataset:
    raw = json.loads(DATA.read_text(encoding="utf-8"))

    def parse(items: list[dict[str, Any]]) -> list[Query]:
        return [Query(q["user"], q["query"], frozenset(q["answers"]), q.get("alone")) for q in items]

    return Dataset(
        raw["episodes"],
        parse(raw["queries"]),
        parse(raw.get("paraphrases", [])),
        parse(raw.get("twins", [])),
        parse(raw.get("chatty", [])),
    )


def store_dataset(data: Dataset, prefix: str, store: Neo4jGraphStore, settings: Settings) -> dict[str, str]:
    """Extract (offline) and persist every episode for users `<prefix>-<user>`; returns episode id → key."""
    limits = Limits(
        max_messages=settings.max_messages,
        max_message_chars=settings.max_message_chars,
        max_episode_chars=settings.max_episode_chars,
    )
    keys = {}
    for item in data.episodes:
        messages = [{"role": role, "content": text} for role, text in item["messages"]]
        episode = build_episode(f"{prefix}-{item['user']}", item["session"], messages, limits=limits)
        extracted = extract_stage(episode_payload(episode), settings=settings, store=store, llm=None)
        persist_stage(extracted, save=store.save_episode)
        keys[episode.id] = item["key"]
    return keys


def recall_at_k(
    data: Dataset,
    prefix: str,
    keys: dict[str, str],
    recall: Callable[[str, str], MemoryContext],
    k: int = 5,
    queries: list[Query] | None = None,
) -> tuple[float, list[str]]:
    """Share of queries (by default the dataset's lexical ones) with an answering episode among the first k
    results, and the queries missed."""
    asked = data.queries if queries is None else queries
    missed = []
    for query in asked:
        context = recall(f"{prefix}-{query.user}", query.text)
        found = {keys.get(e.id) for e in context.related_episodes[:k]}
        if not found & query.answers:
            missed.append(f"{query.user}: {query.text}")
    return 1 - len(missed) / len(asked), missed
