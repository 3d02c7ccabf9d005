"""Extraction benchmark: offline extraction throughput and local keyword extraction latency.

make bench            (or: .venv/bin/python -m tests.benchmarks.bench_extract)
"""

from __future__ import annotations

import random
import time

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
        },
    )


if __name__ == "__main__":
    main()
