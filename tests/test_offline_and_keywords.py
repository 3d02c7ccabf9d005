"""The offline extractor (Chinese and English, deterministic) and recall keywords (local, LLM, cache, budget)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.llm_standin import Reply, StandIn, answer
from tests.services import RedisClient
from worker.extraction import extract
from worker.identity import user_tag
from worker.keys import keywords_cache_pattern
from worker.keywords import KeywordExtractor, local_keywords
from worker.llm.client import litellm_module
from worker.models import Message
from worker.offline import extract_offline
from worker.settings import Settings

ENGLISH = [
    Message(
        role="user", content="My sister Anna moved to Lisbon last year. She works at Acme Corp with her friend Tom."
    ),
    Message(role="assistant", content="How exciting! Does Anna like Lisbon?"),
    Message(role="user", content="Anna loves Lisbon, especially the food."),
]
CHINESE = [Message(role="user", content="我上个月和张伟一起去了北京。北京的冬天很冷，张伟一直想去上海。")]


def test_offline_english(settings: Settings) -> None:
    extraction = extract(ENGLISH, settings=settings)
    assert extraction.kind == "offline" and extraction.model == "offline" and extraction.usage.calls == 0
    entities = {e.name: e.type for e in extraction.result.entities}
    assert entities["Anna"] == "person" and entities["Lisbon"] == "place"
    assert entities["Acme Corp"] == "organization" and entities["Tom"] == "person"
    weights = {(r.source, r.target): r.weight for r in extraction.result.relationships}
    assert weights[("Anna", "Lisbon")] == 2.0  # two sentences name both
    assert "Anna moved to Lisbon" in extraction.result.summary
    assert "How exciting" not in extraction.result.summary  # the summary is what the user said


def test_offline_chinese(settings: Settings) -> None:
    extraction = extract(CHINESE, settings=settings)
    entities = {e.name: e.type for e in extraction.result.entities}
    assert entities["张伟"] == "person" and entities["北京"] == "place" and entities["上海"] == "place"
    pairs = {(r.source, r.target) for r in extraction.result.relationships}
    assert ("张伟", "北京") in pairs and ("张伟", "上海") in pairs
    assert "北京" in extraction.result.summary


@pytest.mark.parametrize(
    ("said", "expected"),
    [
        ("我在阿里巴巴工作了三年。", {"阿里巴巴": "organization"}),  # jieba: a transliterated person name
        ("我在阿里巴巴集团上班。", {"阿里巴巴集团": "organization"}),
        ("她去了腾讯公司上班。", {"腾讯公司": "organization"}),
        ("他在腾讯科技公司实习。", {"腾讯科技公司": "organization"}),
        ("我在 阿里巴巴 工作。", {"阿里巴巴": "organization"}),  # spaces between the words
        ("我哥哥在中国银行工作。", {"哥哥": "person", "中国银行": "organization"}),  # jieba: 哥哥 a place
        ("张伟在清华大学读书。", {"张伟": "person", "清华大学": "organization"}),
        ("我妹妹张丽住在上海。", {"妹妹": "person", "张丽": "person", "上海": "place"}),
    ],
)
def test_offline_chinese_organisations_and_kin_are_typed_as_such(said: str, expected: dict[str, str]) -> None:
    answer = json.loads(extract_offline([Message(role="user", content=said)]))
    assert {e["name"]: e["type"] for e in answer["entities"]} == expected


def test_offline_is_deterministic_across_processes() -> None:
    here = extract_offline(ENGLISH + CHINESE)
    code = (
        "import json,sys; from worker.models import Message; from worker.offline import extract_offline;"
        "print(extract_offline([Message(**m) for m in json.load(sys.stdin)]))"
    )
    payload = json.dumps([m.model_dump() for m in ENGLISH + CHINESE])
    there = subprocess.run(
        [sys.executable, "-c", code], input=payload, capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    assert here == there == extract_offline(ENGLISH + CHINESE)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("北京冬天冷吗", {"北京", "冬天"}),
        ("What did my sister say about Lisbon?", {"sister", "lisbon"}),
        ("我想知道 Tom 在 Acme 工作吗", {"tom", "acme"}),
    ],
)
def test_local_keywords(query: str, expected: set[str]) -> None:
    assert expected <= set(local_keywords(query, 8))


def test_keywords_are_capped_and_fall_back_to_the_query() -> None:
    assert len(local_keywords("alpha beta gamma delta epsilon zeta eta theta iota", 3)) == 3
    assert local_keywords("what is it?", 8) == ["what is it?"]
    assert local_keywords("  ?!  ", 8) == ["?!"]


@pytest.fixture
def keyword_settings(llm_settings: Settings) -> Settings:
    litellm_module()  # the first import takes seconds; these tests are about the budget of the call itself
    return llm_settings.model_copy(update={"llm_keywords_enabled": True, "keywords_budget_ms": 1500})


def test_llm_keywords_are_cached_per_user(
    standin: StandIn, keyword_settings: Settings, redis_client: RedisClient
) -> None:
    user = f"kw-{time.time_ns()}"
    standin.push(answer({"keywords": ["Lisbon", "里斯本", "sister"]}))
    extractor = KeywordExtractor(keyword_settings, redis=redis_client)
    first = extractor.keywords(user, "Where does my sister live now?")
    assert first.source == "local+llm" and "里斯本" in first.words and "sister" in first.words
    second = extractor.keywords(user, "Where does my sister live now?")
    assert second.source == "local+cache" and second.words == first.words
    assert standin.calls == 1
    keys = list(redis_client.scan_iter(keywords_cache_pattern(user_tag(user))))
    assert len(keys) == 1 and 0 < redis_client.ttl(keys[0]) <= keyword_settings.keywords_cache_ttl_s
    redis_client.delete(*keys)
    extractor.close()


def test_llm_keywords_over_budget_fall_back_to_local(
    standin: StandIn, keyword_settings: Settings, redis_client: RedisClient
) -> None:
    user = f"kw-{time.time_ns()}"
    standin.push(Reply(content=json.dumps({"keywords": ["late"]}), delay_s=1.5))
    extractor = KeywordExtractor(keyword_settings, redis=redis_client)
    result = extractor.keywords(user, "北京冬天冷吗", budget_ms=200)
    assert result.source == "local" and result.llm_timed_out
    assert set(result.words) == {"北京", "冬天"}
    extractor.close()
    for key in redis_client.scan_iter(keywords_cache_pattern(user_tag(user))):
        redis_client.delete(key)


def test_llm_keyword_calls_are_bounded_shared_per_query_rate_limited_and_counted(
    standin: StandIn, keyword_settings: Settings, redis_client: RedisClient
) -> None:
    from worker.keywords import MAX_PENDING
    from worker.stats import LLM_CALLS, Stats

    user = f"kw-{time.time_ns()}"
    # slow enough that none ends during the burst below, even on a busy machine
    standin.default = lambda _request: Reply(content=json.dumps({"keywords": ["slow"]}), delay_s=3.0)
    limited = keyword_settings.model_copy(update={"llm_requests_per_minute": 6000, "llm_timeout_s": 10.0})
    extractor = KeywordExtractor(limited, redis=redis_client)
    calls_before = Stats(redis_client).snapshot().get(LLM_CALLS, 0.0)
    try:
        for _ in range(5):  # the same question while its call runs: one call
            assert extractor.keywords(user, "what about the slow train", budget_ms=1).llm_timed_out
        for i in range(MAX_PENDING + 10):  # a burst of new questions: at most MAX_PENDING calls pending
            extractor.keywords(user, f"question number {i} about trains", budget_ms=1)
        deadline = time.monotonic() + 30
        while extractor._calls.pending() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert extractor._calls.pending() == 0
        assert standin.calls == MAX_PENDING  # 1 shared + MAX_PENDING - 1 new; the rest answered without
        assert extractor._client()._limiter is not None  # under the shared Redis rate limit
        # every call of ours counted (the counter is shared: a late call of an earlier test may add to it)
        assert Stats(redis_client).snapshot()[LLM_CALLS] - calls_before >= MAX_PENDING
    finally:
        extractor.close()
        for key in redis_client.scan_iter(keywords_cache_pattern(user_tag(user))):
            redis_client.delete(key)


def test_a_keyword_call_that_ends_after_the_users_erasure_caches_nothing(
    standin: StandIn, keyword_settings: Settings, redis_client: RedisClient
) -> None:
    from worker import erasure

    user = f"kw-{time.time_ns()}"
    standin.default = lambda _request: Reply(content=json.dumps({"keywords": ["late"]}), delay_s=1.0)
    extractor = KeywordExtractor(keyword_settings, redis=redis_client)
    try:
        assert extractor.keywords(user, "where did my sister move", budget_ms=1).llm_timed_out  # still running
        erasure.mark(redis_client, user_tag(user), time.time())  # what forget_user writes first
        deadline = time.monotonic() + 30
        while extractor._calls.pending() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert standin.calls == 1  # the call did finish
        assert list(redis_client.scan_iter(keywords_cache_pattern(user_tag(user)))) == []
    finally:
        extractor.close()
        redis_client.delete(f"memory:erased:{user_tag(user)}")


def test_keywords_without_llm_never_call_it(standin: StandIn, llm_settings: Settings) -> None:
    extractor = KeywordExtractor(llm_settings)  # llm_keywords_enabled is off by default
    assert extractor.keywords("u", "Lisbon sister").words == ["lisbon", "sister"]
    assert standin.calls == 0


def test_a_cache_write_is_kept_only_when_no_erasure_began_after_its_call(redis_client: RedisClient) -> None:
    """The check and the write are one step in Redis: a late write cannot slip between an erasure's mark
    and its cleanup scan (which starts after the mark and deletes what was written before it)."""
    from worker import erasure

    tag, key = user_tag(f"cache-{time.time_ns()}"), f"memory:test:cache:{time.time_ns()}"
    try:
        started = time.time()
        assert erasure.set_unless_erased(redis_client, tag, started, key, "v1", 60)  # no erasure at all
        assert redis_client.get(key) == b"v1"
        erasure.mark(redis_client, tag, started - 10)  # an erasure before the call began: still kept
        assert erasure.set_unless_erased(redis_client, tag, started, key, "v2", 60)
        assert redis_client.get(key) == b"v2" and 0 < redis_client.ttl(key) <= 60
        redis_client.delete(key)
        erasure.mark(redis_client, tag, started + 0.001)  # an erasure after the call began: nothing kept
        assert not erasure.set_unless_erased(redis_client, tag, started, key, "v3", 60)
        assert redis_client.get(key) is None
    finally:
        redis_client.delete(key, f"memory:erased:{tag}")
