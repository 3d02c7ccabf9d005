"""The pure pieces of recall: search terms, time words, fusion and passages (no services needed)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from worker.graph.fusion import FusionWeights, fuse
from worker.graph.lucene import terms_query
from worker.graph.passage import MAX_PASSAGE_CHARS, snippet
from worker.terms import terms
from worker.timeframe import LAG, period_in

NOW = datetime(2026, 12, 3, 15, 0, tzinfo=UTC)


def test_terms_stem_english_drop_function_words_and_make_cjk_bigrams() -> None:
    assert terms("Caroline's paintings, I'm painting!") == ["carolin", "paint", "paint"]
    assert terms("We didn't go") == ["go"]
    assert terms("我的电动车续航") == ["我的", "的电", "电动", "动车", "车续", "续航"]
    assert terms("续") == ["续"]
    assert terms("Ｌｉｓｂｏｎ") == terms("lisbon") == ["lisbon"]
    assert terms("我买了Tesla电动车") == ["我买", "买了", "tesla", "电动", "动车"]  # mixed scripts split
    assert terms("2023年5月") == ["2023", "年", "5", "月"]


def test_terms_are_the_same_from_many_threads() -> None:
    words = "running painted adoption agencies volunteering tournaments relationships".split() * 200
    expected = [terms(w) for w in words]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(terms, words)) == expected


def test_a_terms_query_cannot_carry_lucene_syntax() -> None:
    query = terms_query("uabc", terms('bob AND carl* "dave" title:xavier (emma) OR fred~ \\'))
    assert query == "+user_tag:uabc +(bob carl dave titl xavier emma fred)"
    assert terms_query("uabc", terms("the and of")) is None


def test_periods_named_in_queries() -> None:
    day = period_in("What did Nate do for Joanna on 25 May, 2022?", NOW)
    assert day is not None and day.start == datetime(2022, 5, 25, tzinfo=UTC)
    assert day.end == datetime(2022, 5, 26, tzinfo=UTC) + LAG
    month = period_in("Where did Joanna travel to in July 2022?", NOW)
    assert month is not None and (month.start, month.end) == (
        datetime(2022, 7, 1, tzinfo=UTC),
        datetime(2022, 8, 1, tzinfo=UTC) + LAG,
    )
    us = period_in("What painting did she share on October 13, 2023?", NOW)
    assert us is not None and us.start == datetime(2023, 10, 13, tzinfo=UTC)
    chinese = period_in("我2023年5月去了哪里？", NOW)
    assert chinese is not None and chinese.start == datetime(2023, 5, 1, tzinfo=UTC)
    last_month = period_in("上个月我买了什么？", NOW)
    assert last_month is not None and last_month.start == datetime(2026, 11, 1, tzinfo=UTC)
    week = period_in("what did I cook last week", NOW)
    assert week is not None and week.start == datetime(2026, 11, 23, tzinfo=UTC)
    assert period_in("May I ask what my sister does?", NOW) is None
    assert period_in("What is 31 Foo, 2022?", NOW) is None
    assert period_in("a loan of 2000 dollars last week", NOW) == week.__class__(
        week.start, week.end, "last week"
    )  # a number is not a year unless a date word says so
    for odd in ("0000年", "9999年", "9999-12-31", "9999年12月"):
        assert period_in(odd, NOW) is None  # never an exception on the recall path


def test_time_words_asked_as_of_the_ends_of_the_calendar_name_no_period_and_raise_nothing() -> None:
    """An `as_of` the API accepts (any aware time) made "yesterday" or "this month" overflow the calendar: the
    recall came back degraded, or 503 with strict."""
    words = ("yesterday", "today", "last week", "this week", "last month", "this month", "last year", "5 days ago")
    for as_of in (datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, tzinfo=UTC)):
        for word in words:
            period = period_in(f"what did I do {word}", as_of)
            assert period is None or period.start < period.end


def test_fusion_adds_normalised_lists_and_breaks_ties_by_id() -> None:
    ranked = fuse(
        windows=[{"id": "a", "score": 4.0, "seq": 2}, {"id": "b", "score": 2.0, "seq": 0}],
        episodes=[{"id": "b", "score": 3.0}, {"id": "a", "score": 1.5}],
        in_period=["c"],
        mentions=[],
        episodes_total=10,
        weights=FusionWeights(windows=1.0, episodes=0.5, period=0.3),
        limit=5,
    )
    assert [(r.id, r.score) for r in ranked] == [("a", 1.25), ("b", 1.0), ("c", 0.3)]
    assert ranked[0].seq == 2 and ranked[2].seq is None
    assert ranked[2].matched_by == ["time"]
    tied = fuse(
        windows=[{"id": i, "score": 1.0, "seq": 0} for i in "dcba"],
        episodes=[],
        in_period=[],
        mentions=[],
        episodes_total=4,
        weights=FusionWeights(),
        limit=2,
    )
    assert [r.id for r in tied] == ["a", "b"]


def test_an_entity_in_most_episodes_adds_nothing_and_a_rare_one_adds_most() -> None:
    ranked = fuse(
        windows=[{"id": "x", "score": 1.0, "seq": 0}, {"id": "y", "score": 1.0, "seq": 0}],
        episodes=[],
        in_period=[],
        mentions=[{"id": "x", "name": "Caroline", "df": 10}, {"id": "y", "name": "Lisbon", "df": 2}],
        episodes_total=10,
        weights=FusionWeights(entities=0.5),
        limit=5,
    )
    assert [r.id for r in ranked] == ["y", "x"]
    assert ranked[0].matched_by == ["text", "entity:Lisbon"] and ranked[1].matched_by == ["text"]


def test_a_passage_is_bounded_and_centred_on_the_matched_words() -> None:
    filler = "We chatted about many unrelated little things that day. " * 20
    text = filler + "Then Anna said she adopted a puppy named Biscuit from the shelter. " + filler
    cut = snippet(text, terms("adopted puppy"))
    assert len(cut) <= MAX_PASSAGE_CHARS + 2
    assert "adopted a puppy named Biscuit" in cut
    assert cut.startswith("…") and cut.endswith("…")
    assert snippet("short text", ["x"]) == "short text"
