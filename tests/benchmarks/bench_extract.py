"""Extraction benchmark: offline extraction throughput, local keyword extraction latency, and the prompt
tokens the known facts add to an extraction call (issue 14: one call per episode, its added context stated).

make bench            (or: .venv/bin/python -m tests.benchmarks.bench_extract)
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime

from tests.benchmarks.common import latency_ms, timed, write_results
from worker.keywords import local_keywords
from worker.models import Message
from worker.offline import extract_offline

ENGLISH = [
    "My sister {a} moved to {p} last year. She works at {o} with her friend {b}.",
    "I had dinner with {a} in {p}. We talked about the new project at {o}.",
    "{b} told me that {a} wants to visit {p} in spring. I might join them.",
    "Remind me that my dentist appointment is next Tuesday. {a} will drive me.",
]
CHINESE = [
    "我上个月和{za}一起去了{zp}，{zp}的冬天很冷。",
    "{za}在{zo}工作，最近想搬到{zp}。",
    "周末我和{zb}在{zp}吃了火锅，味道很好。",
]
NAMES = ["Anna", "Tom", "Maria", "Kenji", "Lucas", "Priya"]
PLACES = ["Lisbon", "Berlin", "Kyoto", "Toronto", "Nairobi"]
ORGS = ["Acme Corp", "Globex Inc", "Initech"]
ZH_NAMES = ["张伟", "王芳", "李娜", "刘洋"]
ZH_PLACES = ["北京", "上海", "杭州", "成都"]
ZH_ORGS = ["阿里巴巴", "腾讯", "华为"]
QUERIES = [
    "Where does my sister live now?",
    "北京冬天冷吗",
    "What did Tom say about the project?",
    "我朋友在哪里工作",
    "When is my dentist appointment?",
    "上次和张伟去哪里吃饭了",
]


def conversation(rng: random.Random) -> list[Message]:
    fill = {
        "a": rng.choice(NAMES),
        "b": rng.choice(NAMES),
        "p": rng.choice(PLACES),
        "o": rng.choice(ORGS),
        "za": rng.choice(ZH_NAMES),
        "zb": rng.choice(ZH_NAMES),
        "zp": rng.choice(ZH_PLACES),
        "zo": rng.choice(ZH_ORGS),
    }
    templates = ENGLISH if rng.random() < 0.5 else CHINESE
    messages = []
    for _ in range(3):
        messages.append(Message(role="user", content=rng.choice(templates).format(**fill)))
        messages.append(Message(role="assistant", content="I see, tell me more."))
    return messages


PREDICATES = ["lives_in", "works_at", "friend_of", "sister_of", "likes", "visited", "plans_to", "member_of"]


def known_facts_tokens(rng: random.Random, model: str = "gpt-4o-mini") -> dict[str, object]:
    """Prompt tokens (litellm's counter, the model's tokenizer) of an extraction call of a six-message
    conversation, without and with 5, 10 and 20 known facts (the default bound is 20)."""
    from worker.known_facts import KnownFact, known_facts_text
    from worker.llm.client import litellm_module
    from worker.prompts import extraction as prompt

    litellm = litellm_module()

    def tokens(messages: list[dict[str, str]]) -> int:
        return int(litellm.token_counter(model=model, messages=messages))

    conversations = [conversation(rng) for _ in range(50)]
    base = [tokens(prompt.build_messages(prompt.DEFAULT, c)) for c in conversations]
    added: dict[str, float] = {}
    for n in (5, 10, 20):
        extra = []
        for c in conversations:
            facts = [
                KnownFact(
                    f"f{i}",
                    "user",
                    rng.choice(["user", *NAMES]),
                    rng.choice(PREDICATES),
                    "x",
                    rng.choice(NAMES + PLACES + ORGS + ZH_PLACES + ZH_ORGS),
                    datetime(2026, rng.randint(1, 12), rng.randint(1, 28), tzinfo=UTC) if rng.random() < 0.8 else None,
                )
                for i in range(1, n + 1)
            ]
            known = known_facts_text(facts)
            extra.append(
                tokens(prompt.build_messages(prompt.DEFAULT, c, known=known))
                - tokens(prompt.build_messages(prompt.DEFAULT, c))
            )
        added[f"{n}_facts"] = round(sum(extra) / len(extra), 1)
    return {
        "model_tokenizer": model,
        "prompt_tokens_without_facts_mean": round(sum(base) / len(base), 1),
        "added_tokens_mean": added,
    }


def main() -> None:
    rng = random.Random(5)
    episodes = [conversation(rng) for _ in range(2000)]
    extract_offline(episodes[0])  # loads jieba's dictionary once, as a worker does at its first episode
    started = time.perf_counter()
    for messages in episodes:
        extract_offline(messages)
    seconds = time.perf_counter() - started
    local_keywords(QUERIES[1], 8)
    samples = [timed(lambda q=q: local_keywords(q, 8)) for _ in range(300) for q in QUERIES]  # type: ignore[misc]
    write_results(
        "bench_extract",
        {
            "offline_extraction": {
                "episodes": len(episodes),
                "episodes_per_s": round(len(episodes) / seconds, 1),
                "shape": "6 messages, half English half Chinese",
            },
            "local_keywords_short_queries": latency_ms(samples),
            "known_facts_prompt_tokens": known_facts_tokens(rng),
        },
    )


if __name__ == "__main__":
    main()
