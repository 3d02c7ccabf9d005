"""Retry policy (pure), settings guard on the visibility timeout, the dead-letter store and memctl's dlq/health."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from api_stub.cli_dlq import enqueue_letter
from tasks.policy import backoff_delay_s, is_transient, retry_delay_s
from tests.services import ROOT, RedisClient
from worker.deadletter import DeadLetter, DeadLetterStore
from worker.errors import EpisodeRejected, LLMError, SettingsError, StoreRequestError, StoreUnavailable
from worker.identity import user_tag
from worker.keys import dlq_record, dlq_user
from worker.settings import Settings


def test_backoff_doubles_up_to_the_cap_with_jitter() -> None:
    assert backoff_delay_s(0, 2.0, 60.0, rand=lambda: 0.0) == 1.0
    assert backoff_delay_s(0, 2.0, 60.0, rand=lambda: 1.0) == 2.0
    assert backoff_delay_s(3, 2.0, 60.0, rand=lambda: 1.0) == 16.0
    assert backoff_delay_s(10, 2.0, 60.0, rand=lambda: 1.0) == 60.0
    assert backoff_delay_s(500, 2.0, 60.0, rand=lambda: 0.5) == 45.0  # no overflow for huge attempts


def test_transient_and_permanent_failures() -> None:
    assert is_transient(StoreUnavailable("down"))
    assert is_transient(LLMError("429", transient=True, cause="RateLimitError"))
    assert is_transient(ConnectionRefusedError())
    assert not is_transient(StoreRequestError("bad"))
    assert not is_transient(LLMError("401", transient=False, cause="AuthenticationError"))
    assert not is_transient(EpisodeRejected("bad", "messages"))
    assert not is_transient(ValueError("bug"))


def test_retry_delay_honours_retry_after_and_the_budget(settings: Settings) -> None:
    s = settings.model_copy(update={"retry_backoff_base_s": 1.0, "retry_backoff_cap_s": 30.0, "retry_max_attempts": 3})
    limited = LLMError("429", transient=True, cause="RateLimitError", retry_after_s=20.0)
    assert retry_delay_s(limited, 0, s) == 20.0
    assert retry_delay_s(LLMError("429", transient=True, cause="x", retry_after_s=999.0), 0, s) == 30.0
    assert retry_delay_s(StoreUnavailable("down"), 3, s) is None  # budget spent
    assert retry_delay_s(StoreRequestError("bad"), 0, s) is None  # permanent


def test_settings_refuse_a_visibility_timeout_shorter_than_retry_plus_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_VISIBILITY_TIMEOUT_S", "100")
    monkeypatch.setenv("MEMORY_RETRY_BACKOFF_CAP_S", "90")
    monkeypatch.setenv("MEMORY_TASK_TIME_LIMIT_S", "30")
    with pytest.raises(SettingsError) as info:
        Settings.load()
    assert "visibility_timeout_s" in str(info.value)


def add(store: DeadLetterStore, episode: str, user: str = "u1") -> None:
    store.add(
        stage="extract",
        task_name="memory.extract_episode",
        task_id="t-" + episode,
        episode_id=episode,
        user_id=user,
        payload={"episode": {"id": episode, "user_id": user, "messages": [{"role": "user", "content": "x"}]}},
        error_class="StoreUnavailable",
        message="neo4j unavailable",
        traceback="Traceback ...",
        attempts=3,
    )


def test_dead_letters_merge_per_episode_never_expire_and_purge_per_user(clean_redis: RedisClient) -> None:
    store = DeadLetterStore(clean_redis)
    add(store, "e1")
    add(store, "e1")
    add(store, "e2", user="u2")
    assert store.count() == 2
    first = store.get("extract:e1")
    assert first is not None and first.attempts == 6 and first.payload["episode"]["id"] == "e1"
    assert clean_redis.ttl("memory:dlq:record:extract:e1") == -1  # no expiry
    assert store.purge_user("u1") == 1
    assert store.count() == 1 and clean_redis.scard(dlq_user(user_tag("u1"))) == 0
    add(store, "e3", user="u1")
    add(store, "e3", user="u2")  # the same explicit id from another user: theirs now, not merged with u1's
    taken = store.get("extract:e3")
    assert taken is not None and (taken.user_id, taken.attempts) == ("u2", 3)
    assert store.purge_user("u1") == 0 and store.get("extract:e3") is not None  # erasing u1 keeps u2's letter


def test_replay_removes_the_record_only_after_the_enqueue(clean_redis: RedisClient) -> None:
    store = DeadLetterStore(clean_redis)
    add(store, "e1")

    def broker_down(_letter: object) -> str:
        raise ConnectionError("broker refused")

    with pytest.raises(ConnectionError):
        store.replay("extract:e1", broker_down)
    kept = store.get("extract:e1")
    assert kept is not None and kept.replay_count == 1
    assert store.replay("extract:e1", lambda letter: "new-task") == "new-task"
    assert store.count() == 0


def test_a_replay_that_fails_again_at_once_keeps_its_new_dead_letter(clean_redis: RedisClient) -> None:
    store = DeadLetterStore(clean_redis)
    add(store, "e1")

    def fails_again_before_the_replay_returns(_letter: object) -> str:
        add(store, "e1")  # what a worker does when the replayed message fails for good right away
        return "new-task"

    assert store.replay("extract:e1", fails_again_before_the_replay_returns) == "new-task"
    again = store.get("extract:e1")
    assert again is not None and again.attempts == 6  # the new failure is kept, not removed with the old one
    assert store.count() == 1 and clean_redis.sismember(dlq_user(user_tag("u1")), "extract:e1")


def test_a_replay_never_writes_back_a_record_purged_while_it_read_it(clean_redis: RedisClient) -> None:
    """Issue 33 item 9: replay reads the record, forget_user (or purge) deletes it, replay's count write must
    not bring it back (without index or user set: invisible to list, purge and forget, text and all)."""

    class PurgedMidway(DeadLetterStore):
        def get(self, rid: str) -> DeadLetter | None:
            letter = super().get(rid)
            if letter is not None:  # the erasure runs right after the replay's read
                DeadLetterStore(clean_redis).purge_user("u1")
            return letter

    add(DeadLetterStore(clean_redis), "e1")
    sent: list[str] = []

    def enqueue(letter: DeadLetter) -> str:
        sent.append(letter.id)
        return "new-task"

    assert PurgedMidway(clean_redis).replay("extract:e1", enqueue) is None
    assert sent == [] and not clean_redis.exists(dlq_record("extract:e1"))
    assert DeadLetterStore(clean_redis).count() == 0


def test_a_replayed_persist_letter_is_in_flight_until_it_is_final(clean_redis: RedisClient) -> None:
    from api_stub.client import EpisodeReceipt, MemoryClient
    from worker.inflight import InFlight
    from worker.keys import PERSIST_QUEUE

    store = DeadLetterStore(clean_redis)
    extraction = {"episode_id": "e9", "user_id": "u1", "status": "extracted", "record": {}, "entities": []}
    store.add(
        stage="persist",
        task_name="memory.persist_episode",
        task_id="persist:e9",
        episode_id="e9",
        user_id="u1",
        payload=extraction,
        error_class="StoreUnavailable",
        message="neo4j unavailable",
    )
    client = MemoryClient(Settings.load())
    # What the failed persist task left where the caller's receipt looks: not the replay's outcome.
    dead = {"episode_id": "e9", "user_id": "u1", "status": "dead_lettered"}
    client._celery().backend.store_result("persist:e9", dead, "SUCCESS")
    try:
        store.replay("persist:e9", lambda letter: enqueue_letter(client, letter))
        [state] = client.wait([EpisodeReceipt(episode_id="e9", task_id="persist:e9")], timeout_s=0.5)
    finally:
        client.close()
    assert state.state == "pending"  # no worker ran the replay yet
    assert store.count() == 0 and clean_redis.llen(PERSIST_QUEUE) == 1  # persist alone: no LLM call
    # Recorded in flight with its extraction, so a message the broker loses is found again by the sweep.
    [(episode_id, payload)] = InFlight(clean_redis).overdue(-60)
    assert episode_id == "e9" and payload == extraction


def memctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "api_stub.cli", *args],
        cwd=ROOT,
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_memctl_says_redis_is_unreachable_instead_of_a_traceback(
    monkeypatch: pytest.MonkeyPatch, new_user: Callable[[str], str]
) -> None:
    monkeypatch.setenv("MEMORY_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    for command in (("forget", "--user", new_user("no-redis"), "--yes"), ("dlq", "list"), ("sweep",)):
        out = memctl(*command)
        assert (out.returncode, "Traceback" in out.stderr) == (1, False), command
        assert "Redis is unreachable (ConnectionError)" in out.stderr


def test_memctl_worker_refuses_options_its_workers_could_never_start_with() -> None:
    """Celery refused -1 threads or an unknown log level in each child, which the supervisor restarted every
    second, for ever (checked: ten restarts in 12 s)."""
    for option in (("--extract-concurrency", "-1"), ("--persist-concurrency", "-1"), ("--loglevel", "verbose")):
        out = memctl("worker", *option)
        assert out.returncode == 2 and "Invalid value" in out.stderr, option


def test_memctl_dlq_list_show_purge_and_exit_codes(clean_redis: RedisClient) -> None:
    store = DeadLetterStore(clean_redis)
    add(store, "e1")
    add(store, "e2")
    listed = memctl("dlq", "list", "--json")
    assert listed.returncode == 0
    rows = json.loads(listed.stdout)
    assert [r["id"] for r in rows] == ["extract:e1", "extract:e2"] and "payload" not in rows[0]
    shown = memctl("dlq", "show", "extract:e1")
    assert shown.returncode == 0 and json.loads(shown.stdout)["payload"]["episode"]["id"] == "e1"
    assert memctl("dlq", "show", "extract:nope").returncode == 1
    gone = memctl("dlq", "purge", "extract:nope", "--yes")  # a mistyped id is not a success
    assert (gone.returncode, gone.stdout.strip()) == (1, "purged 0, 1 not found")
    assert memctl("dlq", "purge").returncode == 2  # usage: nothing chosen
    assert memctl("dlq", "purge", "--older-than", "soon", "--yes").returncode == 2
    dry = memctl("dlq", "replay", "--all", "--dry-run")
    assert dry.returncode == 0 and "would replay extract:e1" in dry.stdout and store.count() == 2
    assert memctl("dlq", "purge", "--older-than", "1d", "--yes").stdout.strip() == "purged 0"
    assert memctl("dlq", "purge", "extract:e1", "--yes").stdout.strip() == "purged 1"
    assert memctl("dlq", "purge", "--all", "--yes").stdout.strip() == "purged 1"
    assert store.count() == 0


def test_memctl_health_fails_without_a_worker(clean_redis: RedisClient) -> None:
    out = memctl("health", "--timeout", "1")
    assert out.returncode == 1
    assert "redis: ok" in out.stdout and "neo4j: ok" in out.stdout and "workers: 0" in out.stdout
