"""The Neo4j graph store against a real Neo4j: schema, saves, idempotency, concurrency, search, delete."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import jieba
import pytest

from tests.factories import entities, record, relation
from worker.errors import StoreRequestError
from worker.graph.neo4j_store import Neo4jGraphStore

NewUser = Callable[[str], str]


def schema_names(store: Neo4jGraphStore) -> set[str]:
    with store._session() as s:
        return {r["name"] for r in s.run("SHOW INDEXES YIELD name RETURN name")}


def test_schema_creation_twice_is_harmless(store: Neo4jGraphStore) -> None:
    store.ensure_schema()
    before = schema_names(store)
    store.ensure_schema()
    assert schema_names(store) == before
    assert {"episode_id", "entity_uid", "episode_terms", "chunk_terms", "entity_text", "episode_user"} <= before


def test_schema_creation_survives_the_doubled_mark_of_processes_started_together(store: Neo4jGraphStore) -> None:
    """A worker's processes all ensure the schema as they start; on a new database two of them may each
    create the mark of the predicate upgrade (CI found it: every later start then failed)."""
    store.ensure_schema()
    with store._session() as s:
        s.run("CREATE (:SchemaMark {name: 'relationship_predicates'})").consume()
    try:
        store.ensure_schema()
    finally:
        with store._session() as s:
            s.run(
                "MATCH (m:SchemaMark {name: 'relationship_predicates'}) WITH collect(m) AS marks "
                "UNWIND marks[1..] AS extra DELETE extra"
            ).consume()


def test_save_then_read_back(store: Neo4jGraphStore, new_user: NewUser) -> None:
    user = new_user("alice")
    rec = record(user, "Alice moved to Lisbon to work at Acme", summary="Alice moved to Lisbon")
    result = store.save_episode(
        rec, entities("Alice", "Lisbon", "Acme"), [relation("Alice", "Lisbon", 0.75, "lives in")]
    )
    assert result.created and result.entities == 3 and result.relationships == 1

    context = store.search(user, ["lisbon"], "where does alice live", 5)
    assert [e.id for e in context.related_episodes] == [rec.id]
    hit = context.related_episodes[0]
    assert hit.summary == "Alice moved to Lisbon" and hit.session_id == "s1" and hit.score > 0
    assert "text" in hit.matched_by
    assert {e.name for e in context.related_entities} == {"Alice", "Lisbon", "Acme"}
    [rel] = context.related_relations
    assert (rel.source, rel.target, rel.description, rel.weight) == ("Alice", "Lisbon", "lives in", 0.75)


def test_saving_twice_changes_nothing(store: Neo4jGraphStore, new_user: NewUser) -> None:
    user = new_user("u")
    rec = record(user, "Bob likes tea with Carol")
    args = (rec, entities("Bob", "Carol"), [relation("Bob", "Carol", 0.5)])
    assert store.save_episode(*args).created
    before = store.stats(user)
    again = store.save_episode(*args)
    assert not again.created
    assert store.stats(user) == before
    context = store.search(user, ["bob"], "", 5)
    assert {e.name: e.mentions for e in context.related_entities} == {"Bob": 1, "Carol": 1}
    assert [r.weight for r in context.related_relations] == [0.5]


def test_names_merge_per_user_and_missing_relationship_ends_are_created(
    store: Neo4jGraphStore, new_user: NewUser
) -> None:
    user, other = new_user("a"), new_user("b")
    store.save_episode(record(user, "one with alice"), entities("Ａｌｉｃｅ"), [relation("alice ", "Zed")])
    store.save_episode(record(user, "two with alice"), entities("ALICE"), [])
    store.save_episode(record(other, "three"), entities("Alice"), [])
    assert store.stats(user).entities == 2  # alice + Zed (created from the relationship)
    assert store.stats(other).entities == 1
    context = store.search(user, ["alice"], "", 5)
    alice = next(e for e in context.related_entities if e.name == "Ａｌｉｃｅ")
    assert alice.mentions == 2


def test_episode_id_of_another_user_is_refused(store: Neo4jGraphStore, new_user: NewUser) -> None:
    a, b = new_user("a"), new_user("b")
    store.save_episode(record(a, "mine", episode_id=f"shared-{a}"), [], [])
    with pytest.raises(StoreRequestError):
        store.save_episode(record(b, "theirs", episode_id=f"shared-{a}"), [], [])
    assert store.stats(b).episodes == 0


def test_concurrent_saves_sharing_names_create_each_entity_once(store: Neo4jGraphStore, new_user: NewUser) -> None:
    user = new_user("u")
    names = [f"Person{i}" for i in range(10)]

    def save(i: int) -> None:
        picked = [names[(i + j) % 10] for j in range(5)]
        rels = [relation(picked[j], picked[j + 1]) for j in range(4)]
        store.save_episode(record(user, f"episode {i}"), entities(*picked), rels)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(save, range(200)))

    stats = store.stats(user)
    assert (stats.episodes, stats.entities) == (200, 10)
    with store._session() as s:
        mentions = s.run("MATCH (:Episode {user_id: $u})-[m:MENTIONS]->() RETURN count(m) AS n", u=user).single(
            strict=True
        )["n"]
        total = s.run("MATCH (n:Entity {user_id: $u}) RETURN sum(n.mentions) AS n", u=user).single(strict=True)["n"]
    assert mentions == total == 200 * 5


def test_chinese_episode_found_by_keywords_of_a_chinese_query(store: Neo4jGraphStore, new_user: NewUser) -> None:
    user = new_user("zh")
    beijing = record(user, "用户说北京的气候很干燥，冬天很冷。", summary="北京的气候")
    store.save_episode(beijing, entities("北京"), [])
    store.save_episode(record(user, "用户喜欢在上海吃小笼包。", summary="上海的美食"), entities("上海"), [])
    query = "北京冬天冷吗"
    keywords = [w for w in jieba.lcut(query) if len(w) > 1]
    context = store.search(user, keywords, query, 5)
    assert context.related_episodes[0].id == beijing.id
    assert all(e.user_id == user for e in context.related_episodes)


def test_a_long_chinese_message_looks_up_its_facts_within_lucenes_clause_limit(
    store: Neo4jGraphStore, new_user: NewUser
) -> None:
    """Before an LLM extraction the stage reads the facts the new messages name. Chinese has no spaces: a
    message of 500 characters was one "word" that the cjk analyzer turned into a clause per character in each
    of the index's three fields, over Lucene's 1,024, and Neo4j refused the read (the episode dead-lettered)."""
    user = new_user("zh-long")
    store.save_episode(
        record(user, "我住在北京。", summary="住在北京"), entities("我", "北京"), [relation("我", "北京", 1.0, "住在")]
    )
    filler = "我们周末一起去公园散步然后吃了很多好吃的东西工作很忙但是心情不错" * 40
    for text in ("我住在北京，" + filler, "我住在北京，" + " ".join([filler[:300]] * 6)):
        facts = store.current_facts(user, text, 20)
        assert [(f["source"], f["target"]) for f in facts] == [("我", "北京")]


def test_english_episode_found_by_a_content_word_that_is_no_entity(store: Neo4jGraphStore, new_user: NewUser) -> None:
    user = new_user("en")
    hiking = record(user, "I went hiking in the mountains with my sister last weekend", summary="weekend trip")
    store.save_episode(hiking, entities("Sister"), [])
    store.save_episode(record(user, "I bought a new laptop for work", summary="new laptop"), entities("Laptop"), [])
    context = store.search(user, ["mountains"], "mountains", 5)
    assert [e.id for e in context.related_episodes] == [hiking.id]


@pytest.mark.parametrize(
    "query", ["*", "?*", '"unclosed', "AND OR NOT", "user_id:x", "}) RETURN e //", "' OR 1=1 --", "a\\b", "x" * 5000]
)
def test_syntax_characters_are_literal(store: Neo4jGraphStore, new_user: NewUser, query: str) -> None:
    user, other = new_user("a"), new_user("b")
    store.save_episode(record(other, f"secret {query} OR AND stuff"), entities("Secret"), [])
    context = store.search(user, [query], query, 5)
    assert context.related_episodes == [] and context.related_entities == []


def test_delete_user_removes_everything_and_keeps_others(store: Neo4jGraphStore, new_user: NewUser) -> None:
    gone, kept = new_user("gone"), new_user("kept")
    for i in range(30):
        store.save_episode(
            record(gone, f"gone {i}"), entities(f"G{i % 7}", "Shared"), [relation(f"G{i % 7}", "Shared")]
        )
    store.save_episode(record(kept, "kept"), entities("Shared"), [])
    small_batches = Neo4jGraphStore.__new__(Neo4jGraphStore)
    small_batches.__dict__.update(store.__dict__, _delete_batch=4)
    report = small_batches.delete_user(gone)
    assert (report.episodes, report.entities, report.relationships) == (30, 8, 7)
    assert store.stats(gone).episodes == store.stats(gone).entities == 0
    with store._session() as s:
        left = s.run("MATCH (n {user_id: $u}) RETURN count(n) AS n", u=gone).single(strict=True)["n"]
    assert left == 0
    assert (store.stats(kept).episodes, store.stats(kept).entities) == (1, 1)
    assert store.delete_user(gone).episodes == 0  # idempotent


def test_limit_is_respected_and_the_first_results_do_not_depend_on_it(
    store: Neo4jGraphStore, new_user: NewUser
) -> None:
    user = new_user("limit")
    for i in range(8):
        store.save_episode(record(user, f"coffee number {i}" + " with milk" * (i % 3)), [], [])
    three = [e.id for e in store.search(user, ["coffee"], "", 3).related_episodes]
    eight = [e.id for e in store.search(user, ["coffee"], "", 8).related_episodes]
    assert len(three) == 3 and len(eight) == 8
    assert eight[:3] == three
