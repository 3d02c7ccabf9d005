"""The HTTP facade as a real `memctl serve` process, a real worker, real Redis and Neo4j, and httpx."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.factories import entities, record
from tests.servers import ServerProcess, free_port, run_cli
from tests.services import RedisClient
from tests.workers import WorkerProcess
from worker.graph.neo4j_store import Neo4jGraphStore
from worker.keys import EXTRACT_QUEUE, INFLIGHT_INDEX

NewUser = Callable[[str], str]
TOKEN = "test-token-5f1c-0a9e77"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HEALTH_TTL_S = 2.0  # api_stub/health_probe.py's default


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    env = {"MEMORY_HTTP_TOKEN": TOKEN, "MEMORY_HTTP_MAX_BODY_BYTES": "65536"}
    proc = ServerProcess(tmp_path / "serve.log", env, "serve", ready_path="/healthz").start()
    yield proc
    proc.stop()


def conversation(city: str) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": f"I moved to {city} last spring and I cycle along the riverside every morning."},
        {"role": "assistant", "content": f"{city} sounds lovely for cycling."},
    ]


def test_without_a_valid_token_every_memory_endpoint_answers_401(server: ServerProcess) -> None:
    calls = [
        ("POST", "/v1/episodes", {"user_id": "u", "session_id": "s", "messages": conversation("Lyon")}),
        ("POST", "/v1/recall", {"user_id": "u", "query": "where do I live"}),
        ("DELETE", "/v1/users/u/memory", None),
        ("DELETE", "/v1/users/u/episodes/e1", None),
        ("DELETE", "/v1/users/u/sessions/s1", None),
        ("GET", "/v1/users/u/memory/export", None),
        ("GET", "/metrics", None),
    ]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        for method, path, body in calls:
            answer = httpx.request(method, server.url + path, json=body, headers=headers, timeout=10)
            assert answer.status_code == 401, (method, path, headers, answer.text)
            assert answer.headers["www-authenticate"] == "Bearer"
    assert httpx.get(server.url + "/healthz", timeout=10).json() == {"status": "ok", "redis": True, "neo4j": True}


def test_episode_recall_and_forget_end_to_end(
    server: ServerProcess,
    workers: Callable[..., WorkerProcess],
    store: Neo4jGraphStore,
    new_user: NewUser,
) -> None:
    workers()
    user, other = new_user("http"), new_user("http-other")
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=10) as http:
        persisted_before = _sample(http.get("/metrics").text, "memory_episodes_persisted_total")
        body = {"user_id": user, "session_id": "s1", "messages": conversation("Lyon")}
        accepted = http.post("/v1/episodes", json=body)
        assert accepted.status_code == 202, accepted.text
        receipt = accepted.json()
        assert receipt["episode_id"] and receipt["task_id"]
        http.post("/v1/episodes", json={"user_id": other, "session_id": "s1", "messages": conversation("Oslo")})
        deadline = time.monotonic() + 60
        while store.stats(user).episodes == 0 or store.stats(other).episodes == 0:
            assert time.monotonic() < deadline, "episodes were not persisted"
            time.sleep(0.3)

        found = http.post("/v1/recall", json={"user_id": user, "query": "Which city do I cycle in?"})
        assert found.status_code == 200, found.text
        context = found.json()
        assert [e["id"] for e in context["related_episodes"]] == [receipt["episode_id"]]
        assert context["degraded"] is False
        assert any(e["name"] == "Lyon" for e in context["related_entities"])
        assert all(e["user_id"] == user for e in context["related_entities"])

        forgotten = http.delete(f"/v1/users/{user}/memory")
        assert forgotten.status_code == 200, forgotten.text
        assert forgotten.json()["episodes"] == 1 and forgotten.json()["entities"] >= 1
        assert http.post("/v1/recall", json={"user_id": user, "query": "Lyon"}).json()["related_episodes"] == []
        assert http.delete(f"/v1/users/{user}/memory").json()["episodes"] == 0  # idempotent
        assert store.stats(other).episodes == 1

        metrics = http.get("/metrics")
        assert metrics.status_code == 200
        text = metrics.text
        assert 'memory_queue_depth{queue="memory.extract"}' in text
        assert "memory_dead_letters " in text
        assert _sample(text, "memory_episodes_persisted_total") == persisted_before + 2
        assert _sample(text, "memory_recall_latency_seconds_count") == 2  # this server's recalls
    store.delete_user(other)


def test_forget_one_episode_and_one_session_over_http(
    server: ServerProcess, store: Neo4jGraphStore, new_user: NewUser
) -> None:
    from tests.factories import entities, record

    user, other = new_user("http-part"), new_user("http-part-other")
    one, two = record(user, "Lyon by bike", session_id="a"), record(user, "Oslo by train", session_id="b")
    theirs = record(other, "not yours")
    for r in (one, two, theirs):
        store.save_episode(r, entities("Lyon"), [])
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=10) as http:
        gone = http.delete(f"/v1/users/{user}/episodes/{one.id}")
        assert gone.status_code == 200, gone.text
        assert gone.json()["episodes"] == 1 and gone.json()["entities_updated"] == 1
        assert http.delete(f"/v1/users/{user}/episodes/{one.id}").json()["episodes"] == 0  # idempotent
        # Another user's id is answered as an unknown one (issue 33 item 10): a derived id hashes the user,
        # session and messages, so telling it apart would confirm a guessed conversation.
        foreign = http.delete(f"/v1/users/{user}/episodes/{theirs.id}")
        unknown = http.delete(f"/v1/users/{user}/episodes/ep_{'0' * 32}")
        assert foreign.status_code == unknown.status_code == 200, foreign.text
        assert foreign.json() == {**unknown.json(), "episode_id": theirs.id}
        session = http.delete(f"/v1/users/{user}/sessions/b")
        assert session.status_code == 200 and session.json()["episodes"] == 1
        assert session.json()["entities_removed"] == 1
    assert store.stats(user).episodes == 0 and store.stats(other).episodes == 1


def test_ids_with_slashes_and_names_like_the_routes_reach_what_they_name(
    server: ServerProcess, store: Neo4jGraphStore, new_user: NewUser
) -> None:
    """The path is decoded before routing: a user "x/sessions" erased, or a session named "memory" or
    "chat/7" forgotten, must each do exactly that."""
    from tests.factories import entities, record

    base = new_user("route")
    slashed, plain = f"{base}/sessions", base
    mine = record(plain, "in the session named memory", session_id="memory")
    slash_session = record(plain, "in chat/7", session_id="chat/7")
    theirs = record(slashed, "the slashed user's")
    for r in (mine, slash_session, theirs):
        store.save_episode(r, entities("Ada"), [])
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=10) as http:
        memory_session = http.delete(f"/v1/users/{plain}/sessions/memory")
        assert memory_session.status_code == 200 and memory_session.json()["session_id"] == "memory"
        assert store.stats(slashed).episodes == 1  # not taken for an erasure of user "{plain}/sessions"
        chat = http.delete(f"/v1/users/{plain}/sessions/chat%2F7")
        assert chat.status_code == 200 and chat.json()["episodes"] == 1, chat.text
        erased = http.delete(f"/v1/users/{plain}%2Fsessions/memory")
        assert erased.status_code == 200 and erased.json()["user_id"] == slashed and erased.json()["episodes"] == 1
    assert store.stats(plain).episodes == 0 and store.stats(slashed).episodes == 0


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in metrics:\n{text}")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"session_id": "s", "messages": []}, "user_id"),
        ({"user_id": "u", "session_id": "s", "messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        ({"user_id": "u", "session_id": "s", "messages": []}, "messages"),
        ({"user_id": "u", "session_id": "s", "messages": [{"role": "user"}]}, "messages.0.content"),
        ({"user_id": "u", "session_id": "s", "messages": conversation("Rome"), "extra": 1}, "extra"),
    ],
)
def test_invalid_episodes_get_422_with_the_field_and_enqueue_nothing(
    server: ServerProcess, clean_redis: RedisClient, body: dict[str, object], field: str
) -> None:
    answer = httpx.post(server.url + "/v1/episodes", json=body, headers=AUTH, timeout=10)
    assert answer.status_code == 422, answer.text
    problem = answer.json()
    assert problem["error"] == "invalid_request"
    assert problem["field"] == field, problem
    assert problem["reason"]
    assert clean_redis.llen(EXTRACT_QUEUE) == 0 and clean_redis.zcard(INFLIGHT_INDEX) == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"user_id": "u", "query": "   "}, "query"),
        ({"user_id": "", "query": "hello"}, "user_id"),
        ({"user_id": "u", "query": "hello", "limit": 0}, "limit"),
        ({"user_id": "u", "query": "x" * 8001}, "query"),
        ({"user_id": "u"}, "query"),
    ],
)
def test_invalid_recall_gets_422_with_the_field(server: ServerProcess, body: dict[str, object], field: str) -> None:
    answer = httpx.post(server.url + "/v1/recall", json=body, headers=AUTH, timeout=10)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field


def test_a_body_that_cannot_be_decoded_gets_422_like_any_invalid_request(server: ServerProcess) -> None:
    """Bytes that are not UTF-8, an integer past Python's 4,300 digits, nesting past its recursion limit:
    FastAPI answered 400 with its own {"detail"} body instead of the documented problem body."""
    for raw in (
        b'{"user_id": "u", "query": "\xff"}',
        b'{"user_id": "u", "query": "x", "limit": ' + b"1" * 5000 + b"}",
        b'{"user_id": "u", "query": "x", "as_of": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    ):
        headers = {**AUTH, "Content-Type": "application/json"}
        answer = httpx.post(server.url + "/v1/recall", content=raw, headers=headers, timeout=10)
        assert (answer.status_code, answer.json().get("error")) == (422, "invalid_request"), answer.text


def test_a_body_over_the_limit_gets_413_and_enqueues_nothing(server: ServerProcess, clean_redis: RedisClient) -> None:
    big = {"user_id": "u", "session_id": "s", "messages": [{"role": "user", "content": "x" * 70_000}]}
    answer = httpx.post(server.url + "/v1/episodes", json=big, headers=AUTH, timeout=10)
    assert answer.status_code == 413, answer.text
    assert answer.json()["error"] == "too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts what arrives
        yield b'{"user_id": "u", "session_id": "s", "messages": [{"role": "user", "content": "'
        for _ in range(80):
            yield b"y" * 1000
        yield b'"}]}'

    streamed = httpx.post(
        server.url + "/v1/episodes",
        content=chunks(),
        headers={**AUTH, "Content-Type": "application/json"},
        timeout=10,
    )
    assert streamed.status_code == 413
    assert clean_redis.llen(EXTRACT_QUEUE) == 0 and clean_redis.zcard(INFLIGHT_INDEX) == 0


def test_without_the_token_a_body_is_refused_before_it_is_read(server: ServerProcess) -> None:
    big = {"user_id": "u", "session_id": "s", "messages": [{"role": "user", "content": "x" * 70_000}]}
    answer = httpx.post(server.url + "/v1/episodes", json=big, timeout=10)
    assert answer.status_code == 401 and answer.json()["error"] == "unauthorised"  # not 413: nothing read


def test_the_bearer_scheme_is_case_insensitive(server: ServerProcess) -> None:
    lower = {"Authorization": f"bearer {TOKEN}"}
    answer = httpx.post(server.url + "/v1/recall", json={"user_id": "u", "query": "x"}, headers=lower, timeout=30)
    assert answer.status_code == 200, answer.text


def test_a_user_id_with_a_slash_can_be_erased_over_http(server: ServerProcess, clean_redis: RedisClient) -> None:
    said = {"user_id": "team/alice", "session_id": "s", "messages": [{"role": "user", "content": "hello there"}]}
    assert httpx.post(server.url + "/v1/episodes", json=said, headers=AUTH, timeout=30).status_code == 202
    assert clean_redis.zcard(INFLIGHT_INDEX) == 1  # accepted (no worker runs): the user has memory in flight
    answer = httpx.delete(server.url + "/v1/users/team%2Falice/memory", headers=AUTH, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["user_id"] == "team/alice"
    assert clean_redis.zcard(INFLIGHT_INDEX) == 0  # the erasure reached that user


def test_openapi_document_describes_the_endpoints_and_the_bearer_scheme(server: ServerProcess) -> None:
    document = httpx.get(server.url + "/openapi.json", timeout=10).json()
    assert {"/v1/episodes", "/v1/recall", "/v1/users/{user_id}/memory", "/healthz"} <= set(document["paths"])
    assert "post" in document["paths"]["/v1/episodes"] and "delete" in document["paths"]["/v1/users/{user_id}/memory"]
    schemes = document["components"]["securitySchemes"]
    assert any(s.get("scheme", "").lower() == "bearer" for s in schemes.values())


def test_serve_refuses_to_start_without_a_token_unless_auth_is_explicitly_disabled(tmp_path: Path) -> None:
    for token, why in (("", "required"), ("short", "at least 16 characters")):
        env = {"MEMORY_HTTP_TOKEN": token, "MEMORY_HTTP_AUTH_DISABLED": "false"}
        refused = run_cli("serve", "--port", str(free_port()), env=env)
        assert refused.returncode != 0
        assert "MEMORY_HTTP_TOKEN" in refused.stderr and why in refused.stderr, refused.stderr

    open_server = ServerProcess(
        tmp_path / "open.log", {"MEMORY_HTTP_AUTH_DISABLED": "true"}, "serve", ready_path="/healthz"
    ).start()
    try:
        answer = httpx.post(open_server.url + "/v1/recall", json={"user_id": "nobody-x", "query": "hi"}, timeout=10)
        assert answer.status_code == 200 and answer.json()["related_episodes"] == []
    finally:
        open_server.stop()


def test_healthz_says_unavailable_when_neo4j_is_down(server: ServerProcess, neo4j_restorer: None) -> None:
    from tests.services import services

    services("down", "neo4j")
    deadline = time.monotonic() + 3 * HEALTH_TTL_S  # an answer taken before the stop may be served for 2 s
    while (answer := httpx.get(server.url + "/healthz", timeout=10)).status_code == 200:
        assert time.monotonic() < deadline, "healthz still says ok well after Neo4j stopped"
        time.sleep(0.2)
    assert answer.status_code == 503
    assert answer.json() == {"status": "unavailable", "redis": True, "neo4j": False}
    degraded = httpx.post(server.url + "/v1/recall", json={"user_id": "u", "query": "hello"}, headers=AUTH, timeout=10)
    assert degraded.status_code == 200 and degraded.json()["degraded"] is True
    strict = httpx.post(
        server.url + "/v1/recall", json={"user_id": "u", "query": "hello", "strict": True}, headers=AUTH, timeout=10
    )
    assert strict.status_code == 503 and strict.json()["error"] == "unavailable"


def test_a_flood_of_anonymous_healthz_requests_costs_the_stores_one_probe_per_interval(
    server: ServerProcess, redis_client: RedisClient
) -> None:
    def pings() -> int:
        stats = redis_client.info("commandstats")
        return int(stats.get("cmdstat_ping", {}).get("calls", 0))

    before, started = pings(), time.monotonic()
    with httpx.Client(base_url=server.url, timeout=10) as http:
        answers = [http.get("/healthz") for _ in range(300)]
    elapsed = time.monotonic() - started
    assert all(a.status_code == 200 and a.json()["status"] == "ok" for a in answers)
    probes_allowed = int(elapsed / HEALTH_TTL_S) + 2  # one per interval, plus one at each edge
    other_pings = 3  # redis-py health checks of the server's and the test's own connections
    assert pings() - before <= probes_allowed + other_pings, (pings() - before, elapsed)


def test_the_server_writes_the_audit_record_of_a_recall_without_its_text(
    server: ServerProcess, store: Neo4jGraphStore, new_user: Callable[[str], str]
) -> None:
    """memctl serve configured no logging but uvicorn's: the root logger stayed at WARNING with no handler,
    so the audit records (and the ids of every warning) of the memory.* loggers were dropped."""
    user = new_user("audit-http")
    kept = record(user, "my sister Anna lives in Lisbon")
    store.save_episode(kept, entities("Anna"), [])
    body = {"user_id": user, "query": "secret question about Lisbon", "budget_ms": 30_000}  # a cold process
    assert httpx.post(server.url + "/v1/recall", json=body, headers=AUTH, timeout=10).status_code == 200
    deadline = time.monotonic() + 5
    while "memory.audit" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    [line] = [line for line in server.log().splitlines() if "memory.audit" in line]
    assert user in line and kept.id in line and "latency_ms" in line
    assert "secret question" not in server.log()
