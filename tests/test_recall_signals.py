"""The pure pieces of recall: search terms, time words, fusion and passages (no services needed)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from worker.graph.bm25 import best_windows
from worker.graph.candidates import Candidates, query_terms
from worker.graph.fusion import FusionWeights, fuse
from worker.graph.lucene import MAX_QUERY_TERMS, terms_query
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


def stored(windows: list[tuple[str, int, str]]) -> list[tuple[str, int, list[str], int]]:
    """Windows as the candidate read returns them: each stored term string split, and its length."""
    return [(episode, seq, text.split(), len(text.split())) for episode, seq, text in windows]


def _found(
    windows: list[tuple[str, int, str]],
    query: str,
    *,
    total: int = 0,
    episodes: tuple[str, ...] = (),
    in_period: tuple[str, ...] = (),
    dense: tuple[tuple[str, float, int], ...] = (),
) -> Candidates:
    return Candidates(
        windows=stored(windows),
        windows_total=total or len(windows),
        episodes=list(episodes),
        in_period=list(in_period),
        dense=list(dense),
        query=query_terms(query),
    )


def test_fusion_is_reciprocal_rank_fusion_and_breaks_ties_by_id() -> None:
    found = _found(
        [("a", 2, "lisbon move"), ("b", 0, "lisbon"), ("b", 1, "coffee"), ("d", 0, "move")],
        "lisbon move",
        episodes=("b", "a"),
        in_period=("c",),
    )
    ranked = fuse(found, FusionWeights(period=0), limit=5)
    # a is 1st by window and 2nd by episode, b the reverse (the episode list weighs half), d 3rd by window only
    assert [r.id for r in ranked] == ["a", "b", "d"]
    assert [r.score for r in ranked] == [round(1 / 61 + 0.5 / 62, 6), round(1 / 62 + 0.5 / 61, 6), round(1 / 63, 6)]
    assert ranked[0].seq == 2 and ranked[1].seq == 0 and ranked[0].matched_by == ["text"]
    with_time = fuse(found, FusionWeights(), limit=5)
    assert [r.id for r in with_time] == ["a", "b", "c", "d"]  # c: first of the period, no text
    assert with_time[2].matched_by == ["time"] and with_time[2].seq is None
    tied = fuse(_found([(i, 0, "kayak") for i in "dcba"], "kayak"), FusionWeights(), limit=2)
    assert [r.id for r in tied] == ["a", "b"]
    assert [r.id for r in fuse(found, FusionWeights(), limit=2)] == ["a", "b"]  # the first of a longer answer


def test_the_period_raises_what_the_text_found_first_among_the_episodes_then() -> None:
    windows = [("x", 0, "hike hill"), ("y", 0, "hike"), ("z", 0, "hike")]
    found = _found(windows, "hike hill", episodes=("x", "y", "z"), in_period=("z", "y"))
    ranked = [r.id for r in fuse(found, FusionWeights(), limit=3)]
    assert ranked == ["y", "z", "x"]  # what happened then first, in the order the text ranks it
    assert [r.id for r in fuse(found, FusionWeights(period=0), limit=3)] == ["x", "y", "z"]


def test_window_bm25_uses_the_users_own_statistics_and_the_querys_term_counts() -> None:
    # "boss" is in every one of this user's windows: it says nothing; "birthday" decides
    windows = [("phone", 0, "boss phone number boss"), ("birthday", 0, "boss birthday december")]
    assert [r.id for r in fuse(_found(windows, "boss boss birthday"), FusionWeights(), limit=2)] == [
        "birthday",
        "phone",
    ]
    scores = best_windows(query_terms("boss birthday"), stored(windows), windows_total=2)
    assert scores["birthday"][0] > scores["phone"][0]
    # the user's window count is N: with many windows besides, "boss" weighs again, the term said twice more
    many = best_windows(query_terms("boss boss birthday"), stored(windows), windows_total=1000)
    assert many["phone"][0] > best_windows(query_terms("boss boss birthday"), stored(windows), 2)["phone"][0]
    assert best_windows(query_terms("kayak"), stored(windows), 2) == {}


def test_a_query_searches_all_its_terms_with_their_counts_and_the_llm_keywords_it_lacks() -> None:
    chatter = " ".join(f"word{i} filler{i}" for i in range(100))
    counts = query_terms(f"{chatter} when is my boss's birthday, my boss?")
    assert counts["birthday"] == 1 and counts["boss"] == 2  # after 200 words of small talk: searched
    assert len(counts) == 202
    assert query_terms("boss", expansion=["boss", "manager"]) == {"boss": 1, "manag": 1}
    long = query_terms(" ".join(f"w{i}x" for i in range(1000)) + " birthday")
    assert len(long) == MAX_QUERY_TERMS and "birthday" in long and "w999x" in long and "w0x" not in long


def test_meaning_adds_its_own_list_and_names_itself() -> None:
    found = _found([("a", 0, "kayak")], "kayak", dense=(("b", 0.9, 3), ("a", 0.2, 0)))
    lexical = fuse(found, FusionWeights(), limit=5)
    assert [r.id for r in lexical] == ["a"]
    ranked = fuse(found, FusionWeights(dense=1.0), limit=5)
    assert [r.id for r in ranked] == ["a", "b"] and ranked[1].seq == 3
    assert ranked[0].matched_by == ["text", "meaning"] and ranked[1].matched_by == ["meaning"]


def test_a_passage_is_bounded_and_centred_on_the_matched_words() -> None:
    filler = "We chatted about many unrelated little things that day. " * 20
    text = filler + "Then Anna said she adopted a puppy named Biscuit from the shelter. " + filler
    cut = snippet(text, terms("adopted puppy"))
    assert len(cut) <= MAX_PASSAGE_CHARS + 2
    assert "adopted a puppy named Biscuit" in cut
    assert cut.startswith("…") and cut.endswith("…")
    assert snippet("short text", ["x"]) == "short text"
