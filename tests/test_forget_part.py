"""forget_episode / forget_session: what one episode added is taken back exactly, a forget after an add wins,
and nothing of another user is touched."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from api_stub.client import MemoryClient
from tests.factories import entities, record, relation
from tests.ingest_helpers import graph_facts
from tests.services import RedisClient
from tests.test_policy_and_dlq import memctl
from tests.workers import WorkerProcess
from worker.deadletter import DeadLetterStore
from worker.errors import QueryRejected
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.inflight import InFlight
from worker.models import Entity, Limits, SessionProgress, build_episode
from worker.pipeline import episode_payload, extract_stage, persist_stage
from worker.sessions import progress_key
from worker.settings import Settings

Workers = Callable[..., WorkerProcess]


def entity_rows(store: Neo4jGraphStore, user: str) -> dict[str, dict[str, Any]]:
    with store._session() as s:
        rows = s.run(
            "MATCH (n:Entity {user_id: $u}) RETURN n.name AS name, n.mentions AS mentions, n.description AS d",
            u=user,
        )
        return {r["name"]: {"mentions": r["mentions"], "description": r["d"]} for r in rows}


def relation_rows(store: Neo4jGraphStore, user: str) -> dict[tuple[str, str], dict[str, Any]]:
    with store._session() as s:
        rows = s.run(
            """
            MATCH (a:Entity {user_id: $u})-[r:RELATED_TO]->(b)
            RETURN a.name AS a, b.name AS b, r.weight AS weight, r.support AS support, r.episodes AS episodes,
                   r.description AS description
            """,
            u=user,
        )
        return {(r["a"], r["b"]): dict(r) for r in rows}


def described(*pairs: tuple[str, str]) -> list[Entity]:
    return [Entity(name=name, type="person", description=description) for name, description in pairs]


def test_forgetting_one_of_two_episodes_leaves_exactly_the_others_counts_and_words(
    store: Neo4jGraphStore, client: MemoryClient, new_user: Callable[[str], str]
) -> None:
    user, other = new_user("two"), new_user("bystander")
    first = record(user, "Ada and Bo went climbing", session_id="s1")
    second = record(user, "Ada and Bo went sailing", session_id="s2")
    store.save_episode(
        first,
        [*described(("Ada", "climbs"), ("Bo", "climbs too")), *entities("Rock", type_="place")],
        [relation("Ada", "Bo", 0.5, "climbs with"), relation("Ada", "Rock", 1.0, "climbed")],
    )
    store.save_episode(second, described(("Ada", "sails"), ("Bo", "")), [relation("Ada", "Bo", 0.25, "sails with")])
    store.save_episode(record(other, "Ada of another user"), entities("Ada"), [relation("Ada", "Bo")])
    before_other = graph_facts(store, other)
    assert entity_rows(store, user)["Ada"]["description"] == "sails"

    report = client.forget_episode(user, second.id)  # the latest: what stays is described by the first
    assert (report.episodes, report.entities_removed, report.entities_updated) == (1, 0, 2)
    assert (report.relationships_removed, report.relationships_updated) == (0, 1)
    assert report.session_progress == 0  # no progress line was saved for these sessions
    assert entity_rows(store, user) == {
        "Ada": {"mentions": 1, "description": "climbs"},
        "Bo": {"mentions": 1, "description": "climbs too"},
        "Rock": {"mentions": 1, "description": "about Rock"},
    }
    rels = relation_rows(store, user)
    ab = rels[("Ada", "Bo")]
    assert ab["weight"] == pytest.approx(0.5) and ab["support"] == 1 and ab["episodes"] == [first.id]
    assert ab["description"] == "climbs with"
    assert rels[("Ada", "Rock")]["weight"] == pytest.approx(1.0)
    facts = graph_facts(store, user)
    assert facts["episodes"] == 1 and facts["mentions"] == facts["pairs"] == facts["counters"] == 3
    assert graph_facts(store, other) == before_other

    again = client.forget_episode(user, second.id)  # idempotent
    assert (again.episodes, again.entities_removed, again.relationships_removed) == (0, 0, 0)

    client.forget_episode(user, first.id)
    assert graph_facts(store, user) == {"episodes": 0, "names": [], "counters": 0, "mentions": 0, "pairs": 0}
    assert relation_rows(store, user) == {}
    assert graph_facts(store, other) == before_other
    with store._session() as s:
        assert s.run("MATCH (c:Chunk {user_id: $u}) RETURN count(c) AS n", u=user).single(strict=True)["n"] == 0


def test_no_words_of_a_forgotten_episode_stay_on_what_remains(
    store: Neo4jGraphStore, client: MemoryClient, new_user: Callable[[str], str]
) -> None:
    user = new_user("words")
    said = record(user, "the secret", session_id="a")
    store.save_episode(said, described(("Ada", "keeps the secret")), [relation("Ada", "Bo", 1.0, "hides from")])
    store.save_episode(
        record(user, "plain", session_id="b"), described(("Ada", ""), ("Bo", "")), [relation("Ada", "Bo")]
    )
    client.forget_episode(user, said.id)
    assert entity_rows(store, user)["Ada"]["description"] == ""
    assert relation_rows(store, user)[("Ada", "Bo")]["description"] == "knows"


def test_work_accepted_before_a_forget_is_dropped_by_either_stage(
    settings: Settings, store: Neo4jGraphStore, client: MemoryClient, new_user: Callable[[str], str]
) -> None:
    """Extract stage (no model call) and persist transaction each check the tombstone on their own; a
    pending longer send of a session whose last episode is forgotten is dropped (it holds the forgotten
    messages), and one accepted after the forget is new memory."""
    user = new_user("stages")
    talk = [{"role": "user", "content": "Zanzibar-Q3 is my nickname."}]
    first = extract_stage(
        episode_payload(build_episode(user, "s", talk, limits=Limits())), settings=settings, store=store, llm=None
    )
    assert persist_stage(first, save=store.save_episode)["status"] == "persisted"
    longer = build_episode(user, "s", [*talk, {"role": "user", "content": "And I like tea."}], limits=Limits())
    pending = extract_stage(episode_payload(longer), settings=settings, store=store, llm=None)
    queued = episode_payload(build_episode(user, "t", talk, limits=Limits()))
    client.forget_episode(user, first["episode_id"])
    assert persist_stage(pending, save=store.save_episode)["status"] == "forgotten"
    client.forget_session(user, "t")
    assert extract_stage(queued, settings=settings, store=store, llm=None)["status"] == "forgotten"
    assert graph_facts(store, user)["episodes"] == 0
    fresh = extract_stage(episode_payload(longer), settings=settings, store=store, llm=None)
    assert persist_stage(fresh, save=store.save_episode)["status"] == "persisted"  # accepted after: new memory
    assert graph_facts(store, user)["episodes"] == 1


def test_another_users_episode_id_is_answered_as_an_unknown_one_and_nothing_of_theirs_changes(
    store: Neo4jGraphStore, client: MemoryClient, new_user: Callable[[str], str]
) -> None:
    """Issue 33 item 10: telling a foreign id from an unknown one would confirm a guessed conversation (a
    derived id hashes user, session and messages)."""
    owner, intruder = new_user("owner"), new_user("intruder")
    mine = record(owner, "Ada is my sister")
    store.save_episode(mine, entities("Ada"), [])
    foreign = client.forget_episode(intruder, mine.id)
    unknown = client.forget_episode(intruder, f"ep_{'0' * 32}")
    assert foreign.model_dump(exclude={"episode_id"}) == unknown.model_dump(exclude={"episode_id"})
    assert foreign.episodes == 0
    assert graph_facts(store, owner)["episodes"] == 1
    with store._session() as s:  # what was written is the intruder's own (as for any unknown id)
        theirs = s.run("MATCH (t:Forgotten {user_id: $u}) RETURN count(t) AS n", u=owner).single(strict=True)
        assert theirs["n"] == 0
    again = record(owner, "Ada is my sister", episode_id=mine.id).model_copy(update={"accepted_at": time.time() - 1})
    assert store.save_episode(again, entities("Ada"), []).outcome != "forgotten"  # the owner's sends still count
    with pytest.raises(QueryRejected):
        client.forget_session(owner, "")
    with pytest.raises(QueryRejected):
        client.forget_episode(owner, "a\x00b")


def test_forgetting_a_session_removes_its_episodes_and_progress_so_a_new_send_is_extracted_again(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    user = new_user("session")
    talk = [{"role": "user", "content": "My sister Ada lives in Porto."}]
    workers()
    kept = client.add_episode(user, "keep", [{"role": "user", "content": "Bo plays the cello."}])
    first = client.add_episode(user, "trip", talk)
    assert [s.state for s in client.wait([kept, first], timeout_s=60)] == ["persisted"] * 2
    longer = client.add_episode(user, "trip", [*talk, {"role": "user", "content": "Ada works at a bakery."}])
    assert [s.state for s in client.wait([longer], timeout_s=60)] == ["persisted"]  # its new message only
    assert graph_facts(store, user)["episodes"] == 3

    report = client.forget_session(user, "trip")
    assert report.episodes == 2 and report.session_progress == 1
    assert graph_facts(store, user)["episodes"] == 1
    assert store.write_state(user, progress_key(user, "trip"), "none").line is None
    assert [e.id for e in client.retrieve_memory(user, "Ada Porto bakery").related_episodes] in ([], [kept.episode_id])

    again = client.add_episode(user, "trip", talk)  # accepted after the forget: new memory, extracted again
    assert [s.state for s in client.wait([again], timeout_s=60)] == ["persisted"]
    assert graph_facts(store, user)["episodes"] == 2
    assert "Ada" in entity_rows(store, user)


def test_a_forget_after_an_add_wins_over_work_still_in_flight(
    clean_redis: RedisClient,
    workers: Workers,
    client: MemoryClient,
    store: Neo4jGraphStore,
    new_user: Callable[[str], str],
) -> None:
    """Accepted, not yet extracted (no worker yet), then forgotten: when a worker gets to it, it is dropped
    at extraction; the in-flight record went with the forget; recall never returns it."""
    user = new_user("race")
    receipt = client.add_episode(user, "s", [{"role": "user", "content": "Zanzibar-K9 is my secret nickname."}])
    assert InFlight(clean_redis).count() == 1
    report = client.forget_episode(user, receipt.episode_id)
    assert report.episodes == 0 and report.in_flight == 1
    workers()
    assert [s.state for s in client.wait([receipt], timeout_s=60)] == ["forgotten"]
    assert graph_facts(store, user)["episodes"] == 0
    assert client.retrieve_memory(user, "Zanzibar-K9 nickname").related_episodes == []
    assert InFlight(clean_redis).count() == 0


def test_a_persist_accepted_before_the_forget_is_dropped_in_its_transaction(
    store: Neo4jGraphStore, client: MemoryClient, new_user: Callable[[str], str]
) -> None:
    """The persist transaction itself checks the tombstone (a redelivered persist that had passed
    extraction before the forget): nothing is written, the outcome is `forgotten`."""
    user = new_user("late")
    late = record(user, "said before the forget").model_copy(update={"accepted_at": 1.0})
    client.forget_episode(user, late.id)
    line = SessionProgress(
        key=progress_key(user, late.session_id), user_id=user, session_id=late.session_id, extracted=1, digest="d"
    )
    result = store.save_episode(late, entities("Ada"), [], line)
    assert (result.created, result.outcome) == (False, "forgotten")
    assert graph_facts(store, user)["episodes"] == 0


def test_dead_letters_of_the_forgotten_episode_go_and_others_stay(
    clean_redis: RedisClient, client: MemoryClient, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    user = new_user("dlq")
    letters = DeadLetterStore(clean_redis)
    for episode_id, session in (("ep-gone", "s1"), ("ep-kept", "s2")):
        letters.add(
            stage="extract",
            task_name="memory.extract_episode",
            task_id="t-" + episode_id,
            episode_id=episode_id,
            user_id=user,
            payload={"episode": {"id": episode_id, "user_id": user, "session_id": session}, "accepted_at": 1.0},
            error_class="StoreUnavailable",
            message="neo4j unavailable",
        )
    report = client.forget_episode(user, "ep-gone")
    assert report.dead_letters == 1
    assert [d.episode_id for d in letters.list()] == ["ep-kept"]


def test_memctl_forget_one_episode(store: Neo4jGraphStore, new_user: Callable[[str], str]) -> None:
    user = new_user("cli")
    one = record(user, "Ada sings")
    store.save_episode(one, entities("Ada"), [])
    done = memctl("forget", "--user", user, "--episode", one.id, "--yes")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["episodes"] == 1
    assert graph_facts(store, user)["episodes"] == 0
    both = memctl("forget", "--user", user, "--episode", one.id, "--session", "s1", "--yes")
    assert both.returncode == 2 and "not both" in both.stderr
