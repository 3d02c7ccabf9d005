"""No query, however crafted, returns another user's episodes or entities (property-based)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.factories import entities, record, relation
from worker.graph.neo4j_store import Neo4jGraphStore

SYNTAX = [*"+-&|!(){}[]^\"~*?:\\/'`;,.=<>$%@# ", "AND", "OR", "NOT", "user_id:", "RETURN", "MATCH", "//"]
words = st.one_of(
    st.sampled_from(["alice", "bob", "paris", "北京", "咖啡", "tea", "secret", "ＡＢＣ"]),
    st.sampled_from(SYNTAX),
    st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=12),
)
phrases = st.lists(words, min_size=1, max_size=6).map(" ".join)
user_ids = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=24).filter(str.strip)
names = st.lists(phrases.filter(str.strip).map(lambda s: s.strip()[:150]), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(me=user_ids, victim=user_ids, shared_names=names, query=phrases, keywords=st.lists(phrases, max_size=4))
def test_search_never_returns_another_users_data(
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
    me: str,
    victim: str,
    shared_names: list[str],
    query: str,
    keywords: list[str],
) -> None:
    example = uuid.uuid4().hex[:8]  # new_user is per test; each example needs users of its own
    me, victim = new_user(f"me-{example}-{me}"), new_user(f"victim-{example}-{victim}")
    content = f"{query} {' '.join(keywords)} {' '.join(shared_names)}"
    rels = [relation(shared_names[0], shared_names[-1])]
    theirs = record(victim, content)
    store.save_episode(theirs, entities(*shared_names), rels)
    mine = record(me, content)
    store.save_episode(mine, entities(*shared_names), rels)

    for user, own in ((me, mine.id), (victim, theirs.id)):
        context = store.search(user, keywords, query, 10)
        assert all(e.user_id == user for e in context.related_episodes)
        assert {e.id for e in context.related_episodes} <= {own}
        assert all(n.user_id == user for n in context.related_entities)
        assert all(r.user_id == user for r in context.related_relations)

    stranger = new_user(f"stranger-{example}")
    empty = store.search(stranger, keywords, query, 10)
    assert empty.related_episodes == [] and empty.related_entities == [] and empty.related_relations == []
