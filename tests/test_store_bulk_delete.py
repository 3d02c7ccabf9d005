"""delete_user works in batches for a user with 100k nodes."""

from __future__ import annotations

from collections.abc import Callable

from worker.graph.neo4j_store import Neo4jGraphStore

# Test-only bulk load: 50k episodes and 50k entities with a MENTIONS each, in a few transactions.
BULK = """
UNWIND range($start, $end) AS i
CREATE (e:Episode {id: $u + '-ep-' + i, user_id: $u, summary: 'bulk', session_id: 's'})
CREATE (n:Entity {uid: $u + '-en-' + i, user_id: $u, name: 'n' + i, key: 'n' + i, mentions: 1})
CREATE (e)-[:MENTIONS]->(n)
"""


def test_delete_user_with_100k_nodes(store: Neo4jGraphStore, new_user: Callable[[str], str]) -> None:
    user, neighbour = new_user("big"), new_user("neighbour")
    with store._session() as s:
        for start in range(0, 50_000, 10_000):
            s.run(BULK, u=user, start=start, end=start + 9_999).consume()
        s.run(BULK, u=neighbour, start=0, end=9).consume()
    report = store.delete_user(user)
    assert (report.episodes, report.entities) == (50_000, 50_000)
    assert store.stats(user).episodes == store.stats(user).entities == 0
    assert (store.stats(neighbour).episodes, store.stats(neighbour).entities) == (10, 10)
    store.delete_user(neighbour)
