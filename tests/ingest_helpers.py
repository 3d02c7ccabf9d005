"""Conversations to ingest and exactly-once checks on the graph."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from worker.graph.neo4j_store import Neo4jGraphStore

NAMES = ["Anna", "Boris", "Chen", "Dalia", "Emil", "Farah", "Goran", "Hana"]
CITIES = ["Lisbon", "Oslo", "Quito", "Riga"]


def conversation(rng: random.Random, i: int) -> tuple[list[dict[str, str]], set[str]]:
    a, b = rng.sample(NAMES, 2)
    city = rng.choice(CITIES)
    text = f"I met {a} and {b} in {city}. this was visit number {i}."
    return [{"role": "user", "content": text}, {"role": "assistant", "content": "noted"}], {a, b, city}


def episodes_for(users: list[str], per_user: int, seed: int = 1) -> tuple[list[dict[str, Any]], dict[str, set[str]]]:
    rng = random.Random(seed)
    items: list[dict[str, Any]] = []
    names: dict[str, set[str]] = {u: set() for u in users}
    for i in range(per_user):
        for user in users:
            messages, mentioned = conversation(rng, i)
            items.append({"user_id": user, "session_id": f"s{i}", "messages": messages})
            names[user] |= mentioned
    return items, names


def graph_facts(store: Neo4jGraphStore, user: str) -> dict[str, Any]:
    """Counts that expose any double write: episodes, entities, MENTIONS vs distinct pairs vs mention counters."""
    with store._session() as s:
        # Three subqueries of one row each: under concurrent writes, per-row property reads of one big
        # aggregation could disagree and split it into several rows.
        row = s.run(
            """
            CALL () { MATCH (e:Episode {user_id: $u}) RETURN count(e) AS episodes }
            CALL () { MATCH (n:Entity {user_id: $u}) RETURN collect(n.name) AS names, sum(n.mentions) AS counters }
            CALL () {
              MATCH (ep:Episode {user_id: $u})-[m:MENTIONS]->(x:Entity)
              RETURN count(m) AS mentions, count(DISTINCT [ep.id, x.uid]) AS pairs
            }
            RETURN episodes, names, counters, mentions, pairs
            """,
            u=user,
        ).single(strict=True)
    return {**dict(row), "names": sorted(row["names"])}  # in a stable order (collect's follows storage)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
