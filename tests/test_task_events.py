"""Task events (what Flower shows and may keep on disk) carry ids and timings, never what was said."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

from api_stub.client import MemoryClient
from tests.llm_standin import Reply, StandIn, answer
from tests.services import RedisClient
from tests.workers import WorkerProcess
from worker.settings import Settings

SAID = "My cousin Kilimanjaro-Q7 keeps bees behind the old mill"
EXTRACTED = "Zanzibar-R2 keeps bees"


class EventLog:
    """Every event the broker fans out while the test runs, captured by a real event receiver."""

    def __init__(self, settings: Settings) -> None:
        self.events: list[dict[str, Any]] = []
        self._app = Celery("event-listener", broker=settings.redis_url, set_as_current=False)
        self._ready = threading.Event()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self._app.connection() as connection:
            self._receiver = self._app.events.Receiver(connection, handlers={"*": self.events.append})
            self._ready.set()
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> EventLog:
        self._thread.start()
        assert self._ready.wait(10)
        # Events travel by Redis pub/sub: those sent before the receiver subscribed are gone. Ping until
        # one of ours comes back, so every event of the test is heard.
        deadline = time.monotonic() + 20
        with self._app.events.default_dispatcher() as dispatcher:
            while not any(e["type"] == "test-ping" for e in self.events):
                assert time.monotonic() < deadline, "the event receiver never subscribed"
                dispatcher.send("test-ping")
                time.sleep(0.2)
        return self

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e["type"] == kind)

    def await_count(self, kind: str, n: int, timeout_s: float = 10) -> None:
        """Wait until n events of a kind were heard, or the timeout ends (the caller asserts what it expects):
        a task's own events may follow the result the test waited for."""
        deadline = time.monotonic() + timeout_s
        while self.count(kind) < n and time.monotonic() < deadline:
            time.sleep(0.1)

    def __exit__(self, *_: object) -> None:
        self._receiver.should_stop = True
        self._thread.join(5)


@pytest.mark.parametrize("inline", ["true", "false"])
def test_no_message_or_extraction_text_in_any_event_of_a_run_with_a_retry(
    inline: str,
    settings: Settings,
    clean_redis: RedisClient,
    client: MemoryClient,
    new_user: Callable[[str], str],
    standin: StandIn,
    workers: Callable[..., WorkerProcess],
) -> None:
    standin.push(
        Reply(status=500, content="upstream hiccup"),  # transient: the extract task is retried
        answer({"summary": EXTRACTED, "entities": [{"name": "Zanzibar-R2", "type": "person"}]}),
    )
    env = {"MEMORY_LLM_MODEL": "openai/stand-in", "MEMORY_LLM_API_BASE": standin.url, "MEMORY_LLM_API_KEY": "sk-x"}
    workers(**env, MEMORY_RETRY_BACKOFF_BASE_S="0.2", MEMORY_PERSIST_INLINE=inline)
    # Inline, the extract task writes and ends its chain; otherwise a persist task carries the extraction.
    tasks = 1 if inline == "true" else 2
    with EventLog(settings) as log:
        receipt = client.add_episode(new_user("events"), "s1", [{"role": "user", "content": SAID}])
        [state] = client.wait([receipt], timeout_s=60)
        assert state.state == "persisted"
        assert standin.calls == 2
        log.await_count("task-succeeded", tasks)
    kinds = {e["type"] for e in log.events}
    assert {"task-received", "task-retried", "task-succeeded"} <= kinds, kinds
    assert sum(1 for e in log.events if e["type"] == "task-received") == 1 + tasks  # extract, its retry[, persist]
    assert log.count("task-succeeded") == tasks
    dumped = json.dumps(log.events, default=str)
    for secret in ("Kilimanjaro", "Zanzibar", "bees", "mill"):
        assert secret not in dumped, secret


class Publishes:
    """Every message Redis fans out on Celery's event exchange, counted at the broker (a pattern subscription
    of our own): what one PUBLISH carries is one message, whatever number of events it holds."""

    def __init__(self, redis: RedisClient) -> None:
        self._pubsub = redis.pubsub(ignore_subscribe_messages=True)
        self.channels: list[str] = []

    def __enter__(self) -> Publishes:
        self._pubsub.psubscribe(**{"*celeryev*": self._on})
        self._thread = self._pubsub.run_in_thread(sleep_time=0.05, daemon=True, exception_handler=None)
        return self

    def count(self, part: str) -> int:
        return sum(1 for c in self.channels if part in c)

    def _on(self, message: dict[str, Any]) -> None:
        self.channels.append(message["channel"].decode())

    def __exit__(self, *_: object) -> None:
        self._thread.stop()
        self._thread.join(5)
        self._pubsub.close()


def test_task_events_travel_in_batches_and_each_one_arrives(
    settings: Settings,
    clean_redis: RedisClient,
    client: MemoryClient,
    new_user: Callable[[str], str],
    workers: Callable[..., WorkerProcess],
) -> None:
    workers(MEMORY_EVENTS_FLUSH_MS="200")
    user = new_user("batched-events")
    with EventLog(settings) as log, Publishes(clean_redis) as publishes:
        receipts = [
            client.add_episode(user, f"s{i}", [{"role": "user", "content": f"I met Anna in Lisbon, {i}."}])
            for i in range(30)
        ]
        assert {s.state for s in client.wait(receipts, timeout_s=60)} == {"persisted"}
        log.await_count("task-succeeded", 30)
        time.sleep(0.5)
    for kind in ("task-received", "task-started", "task-succeeded"):
        assert log.count(kind) == 30, kind
    # 90 task events; Celery alone sends nearly one message per event (measured: 2.6 per episode)
    messages = publishes.count("task")
    assert 0 < messages <= 30, messages  # measured: 5 or 6 (Celery's own consumer: 38)


def test_events_waiting_for_their_batch_go_out_when_the_worker_stops(
    settings: Settings,
    clean_redis: RedisClient,
    client: MemoryClient,
    new_user: Callable[[str], str],
    workers: Callable[..., WorkerProcess],
) -> None:
    worker = workers(MEMORY_EVENTS_FLUSH_MS="5000")
    with EventLog(settings) as log:
        receipt = client.add_episode(new_user("events-at-stop"), "s1", [{"role": "user", "content": "I met Anna."}])
        [state] = client.wait([receipt], timeout_s=60)
        assert state.state == "persisted"
        worker.stop()  # SIGTERM: Celery's warm shutdown, long before the 5 s flush
        log.await_count("task-succeeded", 1)
    assert log.count("task-succeeded") == 1


def test_events_waiting_for_their_batch_survive_a_lost_broker_connection(
    settings: Settings,
    clean_redis: RedisClient,
    client: MemoryClient,
    new_user: Callable[[str], str],
    workers: Callable[..., WorkerProcess],
) -> None:
    """Celery carries over to the new connection only the events whose publish failed: those still waiting
    for their batch are flushed before the consumer restarts (worker/consumer.py on_close), not lost."""
    worker = workers(MEMORY_EVENTS_FLUSH_MS="10000")  # the batch's own flush would come after the test looked
    with EventLog(settings) as log:
        user = new_user("events-at-reconnect")
        receipt = client.add_episode(user, "s1", [{"role": "user", "content": "I met Anna."}])
        [state] = client.wait([receipt], timeout_s=60)
        persisted_at = time.monotonic()
        assert state.state == "persisted"
        assert log.count("task-succeeded") == 0  # waiting for its batch
        # The worker's consumers lose their broker connection (the one blocked on BRPOP) and start again.
        consuming = [c["id"] for c in clean_redis.client_list(_type="normal") if c["cmd"] == "brpop"]
        assert consuming
        for client_id in consuming:
            clean_redis.client_kill_filter(_id=client_id)
        log.await_count("task-succeeded", 1, timeout_s=5)  # well before the 10 s flush
        assert log.count("task-succeeded") == 1
        time.sleep(max(0.0, persisted_at + 11 - time.monotonic()))  # past that flush: no second copy
    assert log.count("task-succeeded") == 1
    assert "Connection to broker lost" in worker.log_path.read_text()
