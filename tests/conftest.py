"""Fixtures over the real services started by deploy/local/services.sh (make services-up)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from api_stub.client import MemoryClient
from tests.llm_standin import StandIn
from tests.services import RedisClient, load_services_env, services
from tests.workers import WorkerProcess, worker_env
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.settings import Settings


def pytest_configure(config: pytest.Config) -> None:
    load_services_env()


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings.load()


@pytest.fixture(scope="session")
def store(settings: Settings) -> Iterator[Neo4jGraphStore]:
    graph = Neo4jGraphStore.from_settings(settings)
    if not graph.is_available(timeout_s=5):
        pytest.fail(f"Neo4j is not reachable at {settings.neo4j_uri}: run `make services-up` first")
    graph.ensure_schema()
    yield graph
    graph.close()


@pytest.fixture
def new_user() -> Callable[[str], str]:
    """Unique user ids per test, so tests never see each other's data in the shared database."""
    run = uuid.uuid4().hex[:10]

    def make(name: str) -> str:
        return f"test-{run}-{name}"

    return make


@pytest.fixture
def neo4j_restorer() -> Iterator[None]:
    """For tests that stop Neo4j: it is running again when the test ends, whatever happened."""
    yield
    services("up", "neo4j")


@pytest.fixture
def standin() -> Iterator[StandIn]:
    server = StandIn().start()
    yield server
    server.stop()


@pytest.fixture
def llm_settings(standin: StandIn) -> Settings:
    return Settings.load(
        llm_model="openai/stand-in", llm_api_base=standin.url, llm_api_key="sk-stand-in", llm_timeout_s=2.0
    )


@pytest.fixture
def standin_slow_settings(llm_settings: Settings) -> Settings:
    return llm_settings.model_copy(update={"llm_timeout_s": 1.0})


@pytest.fixture
def redis_client(settings: Settings) -> Iterator[RedisClient]:
    """The test's own connection to the services' Redis, left as it is."""
    client = redis.Redis.from_url(settings.redis_url)
    yield client
    client.close()


@pytest.fixture
def clean_redis(settings: Settings) -> Iterator[RedisClient]:
    """An empty Redis (queues, dead letters, results) before and after the test."""
    client = redis.Redis.from_url(settings.redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start `memctl worker` processes with test timings; all are stopped when the test ends."""
    started: list[WorkerProcess] = []

    def start(*args: str, **env: str) -> WorkerProcess:
        proc = WorkerProcess(tmp_path / f"worker-{len(started)}.log", worker_env(**env), *args).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture
def client(settings: Settings) -> Iterator[MemoryClient]:
    memory = MemoryClient(settings)
    yield memory
    memory.close()
