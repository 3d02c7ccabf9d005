"""Which current facts the extraction is offered (issue 33 item 4): at most `extract_known_facts`, and the
latest of every kind of fact (source and predicate) before a second of any kind, so a fact many newer facts
of another kind crowd out is still offered and can be ended."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from tests.factories import record
from tests.llm_standin import StandIn
from tests.test_facts_change import APRIL, MARCH, extracted, facts, model_that_ends, persisted
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.models import Entity, Relationship
from worker.settings import Settings


def liked(store: Neo4jGraphStore, user: str, n: int) -> None:
    """n newer facts touching the user, of one kind (user likes <hobby i>), each its own episode."""
    for i in range(n):
        hobby = f"Hobby{i}"
        episode = record(user, f"user: I like {hobby}.").model_copy(update={"occurred_at": APRIL + timedelta(hours=i)})
        store.save_episode(
            episode,
            [Entity(name="user", type="person", description=""), Entity(name=hobby, type="concept", description="")],
            [Relationship(source="user", target=hobby, predicate="likes", description="likes", weight=1.0)],
        )


def test_a_move_ends_the_old_home_when_more_newer_facts_than_the_cap_touch_the_user(
    standin: StandIn, llm_settings: Settings, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    standin.default = model_that_ends()
    user = new_user("many-facts")
    assert persisted(extracted(user, "Porto", MARCH, llm_settings, store), store) == "persisted"
    liked(store, user, llm_settings.extract_known_facts + 5)
    lisbon = extracted(user, "Lisbon", APRIL + timedelta(days=30), llm_settings, store)
    offered = standin.requests[-1]["messages"][-1]["content"]
    assert "user lives_in Porto" in offered
    assert offered.count("user likes") == llm_settings.extract_known_facts - 1  # the cap holds
    assert persisted(lisbon, store) == "persisted"
    now = facts(store, user)
    assert now["Porto"]["invalid_from"] is not None and now["Lisbon"]["invalid_from"] is None
