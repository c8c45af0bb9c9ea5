"""What goes into the store and comes out of it: the records its methods take and return, and the checks a value
passes before it is written."""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from dataclasses import dataclass, field
from typing import NamedTuple

from lmprefs.config import label_type_shape

KINDS = ("label", "skip", "flag")
HOLDS = ("flagged", "retired")
SPLIT_NAME = r"[A-Za-z0-9_-]{1,64}"  # an imported split (summarize comparisons: train, valid1, valid2)
_SPLIT_SOURCE = re.compile(rf"import:.+#({SPLIT_NAME})")


class DuplicateLabelError(ValueError):
    """The labeler already labeled (or skipped, or flagged) this item."""


def source_split(source: str) -> str | None:
    """The split an item's source carries, `import:FILE#SPLIT` (summarize comparisons), else None. A plain import of a
    file named like `a#b.jsonl` is not read as one: a split name has no '.'."""
    m = _SPLIT_SOURCE.fullmatch(source)
    return m.group(1) if m else None


@dataclass(frozen=True)
class Item:
    id: int
    query: str
    samples: list[str]
    label_type: str
    source: str
    batch: str | None
    priority: int
    want_labels: int
    status: str
    created: float  # unix time (UTC)
    gold: int | None = None  # the known best sample of a gold question
    hold: str | None = None  # "flagged" or "retired": not served
    gold_note: str | None = None  # the researcher's note on the gold answer
    anchor: bool = False  # a drift anchor: re-served to every labeler once per interval
    acquisition: float | None = None  # the queue's score from `lmprefs rank-queue` (admins only), None: unscored


@dataclass(frozen=True)
class Example:
    """One judgement, ready for reward-model training: `samples[best]` was preferred, or `score`/`difference`."""

    label_id: int
    item_id: int
    label_type: str
    labeler: str
    query: str
    samples: list[str]
    best: int | None = None
    score: float | None = None
    difference: float | None = None
    ranking: list[int] | None = None  # ranking_K: the stored samples' order, best first (`best` is its top)
    confidence: int | None = None  # the labeler's confidence, 1 (a guess) to 3 (sure), if they gave one
    query_tokens: list[int] | None = None  # only when labeled_examples(tokenizer=...) has ids for them
    sample_tokens: list[list[int]] | None = None


@dataclass(frozen=True)
class Answer:
    """One label, skip or flag as stored, for the JSON API."""

    id: int
    item_id: int
    labeler: str
    kind: str
    best: int | None
    score: float | None
    difference: float | None
    note: str | None
    source: str
    created: float
    shown: list[int] | None  # display order: position p showed stored sample shown[p]
    seconds: float | None  # time on task
    ranking: list[int] | None = None  # ranking_K: the stored samples' order, best first
    confidence: int | None = None  # 1 (a guess) to 3 (sure)
    position: int = 0  # in the feed of answers: taken anew when an undo changes the answer (the id stays)


@dataclass(frozen=True)
class Labeler:
    id: int
    name: str
    is_admin: bool
    created: float
    has_token: bool  # can sign in
    admitted: float | None = None  # when they passed onboarding (None: not yet)
    held: float | None = None  # when an admin held them back from real work (None: not held)


@dataclass(frozen=True)
class ImportRow:
    """One labeled question for `import_batch`: the arguments of `add_item` and `add_label` in one row."""

    query: str
    samples: list[str]
    label_type: str
    source: str
    labeler: str
    best: int | None = None
    score: float | None = None
    difference: float | None = None
    ranking: list[int] | None = None
    confidence: int | None = None
    key: str | None = None
    tokenizer: str | None = None
    query_tokens: list[int] | None = None
    sample_tokens: list[list[int]] | None = None


@dataclass
class ImportCounts:
    rows: int = 0
    items_added: int = 0
    items_present: int = 0
    labels_added: int = 0
    labels_present: int = 0


@dataclass(frozen=True)
class Agreement:
    """Pairwise agreement on best_of_N items labeled by more than one labeler."""

    rate: float | None  # agreeing labeler pairs / all labeler pairs, over all such items
    items: int  # items with >= 2 labels
    pairs: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)  # (a, b) a<b -> (rate, items)


def sha(text: str) -> str:
    """The hash that deduplicates texts and stands in for sign-in tokens (only it is stored)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def check_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 100 or name != name.strip():
        raise ValueError(f"labeler name {name!r} must be 1-100 characters without surrounding spaces")
    if any(unicodedata.category(ch) == "Cc" for ch in name):  # a NUL or a newline: no name to show or type
        raise ValueError(f"labeler name {name!r} holds a control character")
    return name


def check_ranking(ranking, n: int, where: str) -> None:
    """A full order of the n options, each once: a repeated or missing option is named."""
    if not isinstance(ranking, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ranking):
        raise ValueError(f"{where}: ranking={ranking!r:.80} must be a list of option indices")
    if bad := [i for i in ranking if not 0 <= i < n]:
        raise ValueError(f"{where}: ranking has option {bad[0]}, outside 0..{n - 1}")
    if repeated := sorted({i for i in ranking if ranking.count(i) > 1}):
        raise ValueError(f"{where}: ranking names option {repeated[0]} more than once; rank each option once")
    if missing := [i for i in range(n) if i not in ranking]:
        raise ValueError(f"{where}: ranking leaves out option {missing[0]}; rank all {n} options")


CONFIDENCE = (1, 2, 3)  # a guess, fairly sure, sure


def check_confidence(confidence, where: str) -> None:
    if confidence is not None and (isinstance(confidence, bool) or confidence not in CONFIDENCE):
        raise ValueError(f"{where}: confidence={confidence!r:.20} must be 1 (a guess), 2 or 3 (sure)")


def check_label_value(label_type: str, best, score, difference, where: str, ranking=None) -> None:
    value_field, n = label_type_shape(label_type)
    if value_field == "ranking":  # a ranking carries its order; `best` may repeat its top choice, nothing else
        if ranking is None or score is not None or difference is not None:
            raise ValueError(f"{where} is {label_type}: a label needs ranking=[...] (all {n} options, best first)")
        check_ranking(ranking, n, f"{where} is {label_type}")
        if best is not None and best != ranking[0]:
            raise ValueError(f"{where} is {label_type}: best={best!r} is not the ranking's top choice {ranking[0]}")
        return
    if ranking is not None:
        raise ValueError(f"{where} is {label_type}: only ranking_K items take a ranking")
    given = {k: v for k, v in (("best", best), ("score", score), ("difference", difference)) if v is not None}
    if set(given) != {value_field}:
        raise ValueError(f"{where} is {label_type}: a label needs exactly {value_field}=..., got {given or 'nothing'}")
    v = given[value_field]
    if value_field == "best":
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
            raise ValueError(f"{where} is {label_type}: best={v!r} is out of range 0..{n - 1}")
    elif isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{where} is {label_type}: {value_field}={v!r} is not a finite number")


class Question(NamedTuple):
    """A pending item a reward-model ensemble may score for the queue: its texts and, when stored for the tokenizer
    asked about, their token ids."""

    item_id: int
    query: str
    samples: list[str]
    query_tokens: list[int] | None
    sample_tokens: list[list[int]] | None


class Candidate(NamedTuple):
    """An item the web app's queue may serve."""

    id: int
    want_labels: int
    labels: int  # labels it has (not skips or flags)


class BestOfAnswer(NamedTuple):
    """One answer on a best_of_N item, for the quality measures."""

    item_id: int
    labeler: str
    kind: str
    best: int | None
    shown: list[int] | None
    seconds: float | None
    gold: int | None  # the item's right answer, if it is a gold question
    first_kind: str  # the labeler's first answer (kind, best): what gold accuracy counts, however an undo changed it
    first_best: int | None


class Flag(NamedTuple):
    item_id: int
    labeler: str
    note: str | None
    created: float
    query: str


class HeldItem(NamedTuple):
    item_id: int
    hold: str
    query: str


class GoldItem(NamedTuple):
    item_id: int
    gold: int  # the right answer, a stored sample index
    answers: int  # labels on it
    right: int  # labels that picked `gold`
    query: str
