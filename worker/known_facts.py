"""Facts that change over time, in the one extraction call: the user's current facts about what the new
messages are likely about are offered to the model with short ids (f1, f2, ...); its answer may say which of
them the new messages end (a relationship's `ends`: replaced by it; the answer's `ends`: no longer true).
Only offered ids count: an id the model invents is ignored. The persist transaction then marks the ended
facts `invalid_from` (worker/graph/facts.py): never deleted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from worker.facts_text import fact_time
from worker.identity import entity_key
from worker.models import ExtractionResult, FactEnd


@dataclass(frozen=True)
class KnownFact:
    id: str  # f1, f2, ... in the order offered
    source_key: str
    source: str
    predicate: str
    target_key: str
    target: str
    valid_from: datetime | None

    def line(self) -> str:
        since = f" (since {self.valid_from.date().isoformat()})" if self.valid_from else ""
        return f"{self.id}: {self.source} {self.predicate} {self.target}{since}"


def known_facts(rows: Sequence[dict[str, object]]) -> list[KnownFact]:
    """Store rows (worker/graph/facts.py CURRENT_FACTS) → facts with their ids, in order."""
    return [
        KnownFact(
            id=f"f{i}",
            source_key=str(r["source_key"]),
            source=str(r["source"]),
            predicate=str(r["predicate"]),
            target_key=str(r["target_key"]),
            target=str(r["target"]),
            valid_from=r["valid_from"] if isinstance(r["valid_from"], datetime) else None,
        )
        for i, r in enumerate(rows, start=1)
    ]


def known_facts_text(facts: Sequence[KnownFact]) -> str:
    """The prompt's block of known facts ("" when there are none)."""
    if not facts:
        return ""
    return "Known facts (current, from earlier conversations):\n" + "\n".join(f.line() for f in facts)


def ended_facts(result: ExtractionResult, offered: Sequence[KnownFact]) -> tuple[FactEnd, ...]:
    """The offered facts the answer ends, each once (a replacement wins over a bare end); ids that were not
    offered are ignored, as is a fact "replaced" by itself."""
    by_id = {f.id: f for f in offered}
    ends: dict[tuple[str, str, str], FactEnd] = {}
    for rel in result.relationships:
        new = (entity_key(rel.source), rel.predicate, entity_key(rel.target))
        for fact_id in rel.ends:
            fact = by_id.get(fact_id.strip())
            if fact is None or (fact.source_key, fact.predicate, fact.target_key) == new:
                continue
            key = (fact.source_key, fact.predicate, fact.target_key)
            ends.setdefault(
                key,
                FactEnd(
                    source_key=key[0],
                    predicate=key[1],
                    target_key=key[2],
                    at=fact_time(rel.valid_from),
                    replaced_by=new,
                ),
            )
    for fact_id in result.ends:
        fact = by_id.get(fact_id.strip())
        if fact is not None:
            key = (fact.source_key, fact.predicate, fact.target_key)
            ends.setdefault(key, FactEnd(source_key=key[0], predicate=key[1], target_key=key[2]))
    return tuple(ends.values())
