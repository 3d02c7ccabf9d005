"""The `offline` model: a deterministic local extractor that needs no network and no key.

It is a fallback of lower quality than a real LLM: entities come from jieba part-of-speech tags (Chinese)
and from capitalised spans and a few salient nouns (English); relationships are co-occurrence within a
sentence, weighted by count; the summary is extractive (the sentences that mention the most entities).
Its answer is JSON that goes through the same validation as an LLM's.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from worker.models import Message
from worker.terms import terms

MODEL_NAME = "offline"


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_SENTENCE_END = re.compile(r"(?<=[.!?。！？；;])\s*|\n+")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_CAPITALISED = re.compile(r"\b[A-Z][\w'’&-]*(?:\s+(?:of\s+|de\s+|the\s+)?[A-Z][\w'’&-]*)*")
_SPEAKER = re.compile(r"^\s*[A-Z][\w'’.-]*(?: [A-Z][\w'’.-]*){0,2}:\s+")
_DETERMINED = re.compile(r"\b(?:my|our|his|her|their|your)\s+([a-z][a-z-]{2,})\b")
_JIEBA_TYPES = {"nr": "person", "nrfg": "person", "nrt": "person", "ns": "place", "nt": "organization", "nz": "other"}

_STOP = _words(
    "i me my we our you your he she it they them his her their the a an and or but so if then this that "
    "these those is are was were be been am do does did have has had can could will would shall should "
    "may might must what which who whom whose when where why how hi hello hey yes no ok okay thanks thank "
    "please sorry well also actually really just today yesterday tomorrow tonight now maybe sure great "
    "good nice oh ah let lets let's monday tuesday wednesday thursday friday saturday sunday january "
    "february march april june july august september october november december there here not all any "
    "some very much many more most lot bit way time thing things stuff day days week weeks weekend year "
    "years month months one two "
)
_PLACE_CUES = _words("in at to from near visit visited visiting moved move living live lives")
_PERSON_CUES = _words(
    "friend sister brother mother father mom dad wife husband son daughter boss colleague partner "
    "girlfriend boyfriend grandma grandpa aunt uncle cousin named called with met "
)
_ORG_WORDS = re.compile(r"\b(?:Inc|Corp|Ltd|LLC|GmbH|University|College|Company|Bank|Hospital|School|Group)\b")
_KIN = _words(
    "sister brother mother father mom dad wife husband son daughter boss colleague partner girlfriend "
    "boyfriend grandma grandpa aunt uncle cousin friend kids children "
)
_ZH_ORG_SUFFIXES = (
    "公司", "集团", "银行", "大学", "学院", "医院", "研究所", "研究院", "中学", "小学", "基金会", "协会",
    "事务所", "出版社", "电视台", "报社", "俱乐部", "工作室", "科技",
)  # fmt: skip
_ZH_WORKPLACE_VERBS = frozenset({"工作", "上班", "实习", "任职", "入职", "读书", "上学", "念书"})
_ZH_KIN = frozenset(
    "哥哥 姐姐 弟弟 妹妹 妈妈 爸爸 母亲 父亲 丈夫 妻子 老公 老婆 儿子 女儿 爷爷 奶奶 外公 外婆 叔叔 阿姨 舅舅 "
    "表哥 表姐 表弟 表妹 堂哥 堂姐 同事 老板 男朋友 女朋友".split()
)
MAX_ENTITIES = 20
MAX_SALIENT = 6
SUMMARY_SENTENCES = 3
SUMMARY_CHARS = 400
MIN_CONTENT_TERMS = 3  # fewer search terms than this: a greeting or a filler, not a fact


@dataclass
class _Found:
    name: str
    type: str
    first_sentence: str
    count: int = 0


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


def _english(sentence: str) -> Iterator[tuple[str, str]]:
    for match in _CAPITALISED.finditer(sentence):
        words = match.group(0).split()
        while words and words[0].lower() in _STOP:
            words = words[1:]
        if not words:
            continue
        name = " ".join(words)
        if len(words) == 1 and (len(name) < 2 or name.lower() in _STOP):
            continue
        before = sentence[: match.start()].split()[-1:]
        cue = before[0].lower().strip(",") if before else ""
        if _ORG_WORDS.search(name):
            kind = "organization"
        elif cue in _PERSON_CUES:
            kind = "person"
        elif cue in _PLACE_CUES:
            kind = "place"
        else:
            kind = "other"
        yield name, kind
    for match in _DETERMINED.finditer(sentence.lower()):
        noun = match.group(1)
        if noun not in _STOP:
            yield noun, "person" if noun in _KIN else "concept"


def _chinese(sentence: str) -> Iterator[tuple[str, str]]:
    """jieba's name tags, corrected where they mislead: a name followed by an organisation word (腾讯 + 公司)
    is one organisation (腾讯公司), as is a word ending in one (北京大学); a name one works or studies at
    (在阿里巴巴工作: jieba tags 阿里巴巴 as a transliterated person name) is an organisation; a kinship word
    (哥哥, which jieba may tag as a place) is a person, as "my brother" is in English."""
    import jieba
    import jieba.posseg  # imported on first use: the dictionary load is not import-time work

    jieba.setLogLevel(logging.WARNING)

    pairs = [(p.word.strip(), p.flag) for p in jieba.posseg.cut(sentence) if p.word.strip()]
    i = 0
    while i < len(pairs):
        word, flag = pairs[i]
        before = pairs[i - 1][0] if i > 0 else ""
        i += 1
        if word in _ZH_KIN:
            yield word, "person"
            continue
        kind = _JIEBA_TYPES.get(flag)
        if not kind or len(word) < 2 or not _CJK.search(word):
            continue
        following = pairs[i][0] if i < len(pairs) else ""
        if kind == "person" and before == "在" and following in _ZH_WORKPLACE_VERBS:
            kind = "organization"
        while i < len(pairs) and pairs[i][0] in _ZH_ORG_SUFFIXES:  # 腾讯 + 科技 + 公司: one organisation
            word, kind, i = word + pairs[i][0], "organization", i + 1
        if word.endswith(_ZH_ORG_SUFFIXES):
            kind = "organization"
        yield word, kind


def _entities_in(sentence: str) -> list[tuple[str, str]]:
    found = list(_english(sentence))
    if _CJK.search(sentence):
        found.extend(_chinese(sentence))
    return found


def extract_offline(conversation: Sequence[Message]) -> str:
    """The offline model's answer, as JSON text in the ExtractionResult shape."""
    said = [m for m in conversation if m.role == "user"] or list(conversation)
    all_sentences = [s for m in said for s in sentences(m.content)]
    found: dict[str, _Found] = {}
    per_sentence: list[list[str]] = []
    salient = 0
    for sentence in all_sentences:
        keys: list[str] = []
        for name, kind in _entities_in(sentence):
            key = name.casefold()
            if key not in found:
                if len(found) >= MAX_ENTITIES or (kind == "concept" and salient >= MAX_SALIENT):
                    continue
                salient += kind == "concept"
                found[key] = _Found(name, kind, sentence[:200])
            found[key].count += 1
            if key not in keys:
                keys.append(key)
        per_sentence.append(keys)

    weights: dict[tuple[str, str], int] = {}
    for keys in per_sentence:
        for i, a in enumerate(keys):
            for b in keys[i + 1 :]:
                weights[(a, b)] = weights.get((a, b), 0) + 1

    answer = {
        "summary": summarize(all_sentences, per_sentence),
        "entities": [{"name": f.name, "type": f.type, "description": f.first_sentence} for f in found.values()],
        "relationships": [
            {"source": found[a].name, "target": found[b].name, "description": "mentioned together", "weight": float(w)}
            for (a, b), w in weights.items()
        ],
    }
    return json.dumps(answer, ensure_ascii=False)


def summarize(all_sentences: Sequence[str], per_sentence: Sequence[Sequence[str]] = ()) -> str:
    """Extractive: the most informative sentences, in their order. A sentence scores by its distinct content
    words (a `Name:` speaker prefix left out) and the entities it names; greetings and fillers ("Hey Mel,
    what's up?") have too few content words and are left out while anything else is there."""
    if not all_sentences:
        return ""
    counts = list(per_sentence) or [[] for _ in all_sentences]
    content = [len(set(terms(_SPEAKER.sub("", s)))) for s in all_sentences]
    informative = [i for i, n in enumerate(content) if n >= MIN_CONTENT_TERMS] or list(range(len(all_sentences)))
    scored = sorted(informative, key=lambda i: (-(min(content[i], 12) + len(counts[i]) / 2), i))
    chosen = sorted(scored[:SUMMARY_SENTENCES])
    joiner = "" if _CJK.search(all_sentences[0]) else " "
    return joiner.join(all_sentences[i] for i in chosen)[:SUMMARY_CHARS]


def summarize_messages(conversation: Sequence[Message]) -> str:
    """A summary from the conversation text alone, for degraded extractions."""
    said = [m for m in conversation if m.role == "user"] or list(conversation)
    return summarize([s for m in said for s in sentences(m.content)])
