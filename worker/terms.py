"""Search terms: the one text analysis that both the write path (indexed terms) and recall (query terms) use.

Latin words are lower-cased, English function words dropped and the rest stemmed (Snowball English, PyStemmer), so
"painting" finds "painted"; CJK runs become overlapping bigrams (as Lucene's cjk analyzer does), so 续航
finds 续航里程 without a dictionary. The terms are stored space-separated and indexed with Lucene's
`whitespace` analyzer: what Neo4j indexes is exactly what this module produced.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from functools import lru_cache
from typing import Any

from worker.stopwords import ENGLISH_STOP

# CJK ideographs, kana and Hangul are written without spaces: they become bigrams, never one long "word"
_CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK_CHARS}]+|[^\W_{_CJK_CHARS}]+(?:['’][^\W_{_CJK_CHARS}]+)*")
_CJK = re.compile(rf"[{_CJK_CHARS}]")
_CLITIC = re.compile(r"['’](?:s|m|re|ve|ll|d|t)$")
# what is left of negated contractions ("didn't" → "didn") says nothing about content
_NEGATED = frozenset(
    "ain aren can couldn didn doesn don hadn hasn haven isn mustn shan shouldn wasn weren won wouldn".split()
)
MAX_TERM_CHARS = 40  # longer runs (hashes, base64) carry no meaning and bloat the index
_LONGEST_TOKEN = MAX_TERM_CHARS + 3  # a token's clitic ("'ll") is cut before its length is checked


_local = threading.local()


def _stemmer() -> Any:
    """One stemmer per thread: a Snowball stemmer keeps its state while it stems (not thread-safe)."""
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        import Stemmer  # PyStemmer, the C Snowball stemmers: imported on first use (≈1 ms), not at import

        stemmer = _local.stemmer = Stemmer.Stemmer("english")
    return stemmer


def _cjk_bigrams(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


@lru_cache(maxsize=65_536)
def _term(token: str) -> str | None:
    """A (normalised, case-folded) word's term, None if it is left out. Cached: words repeat, and most of
    an episode's text is analysed more than once (each message is in up to three search windows)."""
    word = _CLITIC.sub("", token).replace("’", "'")
    if word in ENGLISH_STOP or word in _NEGATED or len(word) > MAX_TERM_CHARS:
        return None
    if len(word) == 1 and not word.isdigit():
        return None
    stemmed: str = _stemmer().stemWord(word.replace("'", ""))
    return stemmed


def terms(text: str) -> list[str]:
    """Text → its search terms, in order (duplicates kept: term frequency matters to BM25)."""
    out: list[str] = []
    for token in _TOKEN.findall(unicodedata.normalize("NFKC", text).casefold()):
        if _CJK.match(token):
            out.extend(_cjk_bigrams(token))
        elif len(token) <= _LONGEST_TOKEN:  # longer ones are never terms (and never fill the cache)
            term = _term(token)
            if term is not None:
                out.append(term)
    return out


def indexed(text: str) -> str:
    """The terms of a text as the string Neo4j indexes (whitespace analyzer)."""
    return " ".join(terms(text))
