"""Simulated labelers for controlled experiments: the paper's mock tasks replace humans with a known score function,
so a reward model's accuracy and the policy's real gain can be measured. `ScoreLabeler` answers best-of-N questions
from a score function, noiselessly, Boltzmann-rationally (softmax(score / T)) or with a share of uniformly random
answers; it is deterministic given its seed.

Labelers score the *continuation* (the response text) alone, not query + response: the paper's mock sentiment task
rewards the sentiment of the continuation, and scoring the shared query would only add the same constant to every
sample of a question. `ScoreLabeler(..., with_query=True)` scores query + response instead. A judge that needs the
query beside the response (the summarization judge compares a summary with its article) is marked `@reads_query`
and is called as fn(responses, queries); `score_texts` calls either kind.
"""

from __future__ import annotations

import math
import random
import re
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypedDict

from lmprefs.assets.models import minilm_dir
from lmprefs.config import label_type_shape
from lmprefs.labels.store import DuplicateLabelError, Item, LabelStore

if TYPE_CHECKING:
    from torch import Tensor

# fn(responses) -> scores, or fn(responses, queries) for a judge marked `reads_query`
ScoreFn = Callable[..., list[float]]


class LabelValue(TypedDict, total=False):
    """A label's value as keyword arguments of `LabelStore.add_label`: the one field its label type has."""

    best: int
    score: float
    difference: float
    ranking: list[int]


def reads_query(fn):
    """Mark a score function as a judge of (response, query) pairs: it is called as fn(responses, queries)."""
    fn.reads_query = True
    return fn


def score_texts(fn, responses: list[str], queries: list[str] | None = None) -> list[float]:
    """fn's scores of `responses`; a `reads_query` judge also gets each response's query text."""
    if getattr(fn, "reads_query", False):
        if queries is None or len(queries) != len(responses):
            raise ValueError(f"{getattr(fn, '__name__', fn)} judges a response against its query: pass one query "
                             "per response")  # fmt: skip
        return fn(responses, queries)
    return fn(responses)


class ScoreLabeler:
    """Answers questions from `score_fn(texts) -> scores` (higher is better).

    best_of_N: P(pick i) = random_rate / N + (1 - random_rate) * softmax(scores / temperature)_i; temperature 0 is
    the argmax (ties broken uniformly at random, so identical samples carry no position bias).
    ranking_K: the same noise as a Plackett-Luce draw: with probability random_rate a uniformly random order, else
    the options picked one after another, each by softmax(scores / temperature) over those left (temperature 0:
    sorted by score, ties in random order).
    scalar_rating: score of the sample; scalar_compare: score(sample1) - score(sample0) (both noiseless).
    """

    def __init__(
        self,
        score_fn: ScoreFn,
        *,
        temperature: float = 0.0,
        random_rate: float = 0.0,
        seed: int = 0,
        with_query: bool = False,
    ) -> None:
        if not temperature >= 0:
            raise ValueError(f"temperature={temperature} must be >= 0")
        if not 0 <= random_rate <= 1:
            raise ValueError(f"random_rate={random_rate} must be in [0, 1]")
        self.score_fn, self.temperature, self.random_rate = score_fn, temperature, random_rate
        self.with_query = with_query
        self.rng = random.Random(seed)

    def scores(self, samples: list[str], query: str = "") -> list[float]:
        if getattr(self.score_fn, "reads_query", False):
            return [float(s) for s in self.score_fn(samples, [query] * len(samples))]
        return [float(s) for s in self.score_fn([query + s if self.with_query else s for s in samples])]

    def probabilities(self, scores: list[float]) -> list[float]:
        """The choice distribution over the samples given their scores (what `pick` samples from)."""
        n = len(scores)
        if self.temperature == 0:
            top = max(scores)
            greedy = [float(s == top) / sum(s == top for s in scores) for s in scores]
        else:
            z = [s / self.temperature for s in scores]
            m = max(z)  # subtract the max so exp() cannot overflow
            e = [math.exp(v - m) for v in z]
            greedy = [v / sum(e) for v in e]
        return [self.random_rate / n + (1 - self.random_rate) * p for p in greedy]

    def pick(self, samples: list[str], query: str = "") -> int:
        """Index of the chosen sample."""
        scores = self.scores(samples, query)
        if self.rng.random() < self.random_rate:
            return self.rng.randrange(len(samples))
        if self.temperature == 0:
            top = max(scores)
            return self.rng.choice([i for i, s in enumerate(scores) if s == top])
        z = [s / self.temperature for s in scores]
        m = max(z)
        return self.rng.choices(range(len(samples)), weights=[math.exp(v - m) for v in z])[0]

    def rank(self, samples: list[str], query: str = "") -> list[int]:
        """The samples' indices, best first (a Plackett-Luce draw from the scores; see the class docstring)."""
        scores = self.scores(samples, query)
        left = list(range(len(samples)))
        if self.rng.random() < self.random_rate:
            self.rng.shuffle(left)
            return left
        if self.temperature == 0:
            self.rng.shuffle(left)  # ties fall in random order: identical samples carry no position bias
            return sorted(left, key=lambda i: -scores[i])
        order = []
        while left:
            m = max(scores[i] / self.temperature for i in left)
            w = [math.exp(scores[i] / self.temperature - m) for i in left]
            order.append(left.pop(self.rng.choices(range(len(left)), weights=w)[0]))
        return order

    def answer(self, label_type: str, query: str, samples: list[str]) -> LabelValue:
        """The label for a question of `label_type`, as keyword arguments of `LabelStore.add_label`."""
        value_field, n = label_type_shape(label_type)
        if len(samples) != n:
            raise ValueError(f"{label_type} needs {n} samples, got {len(samples)}")
        if value_field == "best":
            return {"best": self.pick(samples, query)}
        if value_field == "ranking":
            return {"ranking": self.rank(samples, query)}
        scores = self.scores(samples, query)
        return {"score": scores[0]} if value_field == "score" else {"difference": scores[1] - scores[0]}


# -- score functions ------------------------------------------------------------------------------------------

_vader = None
_vader_lock = threading.Lock()


def vader_score(texts: list[str]) -> list[float]:
    """VADER compound sentiment in [-1, 1] (the mock sentiment task's scorer; lexicon bundled with vaderSentiment)."""
    global _vader
    with _vader_lock:  # build the analyzer once (it reads its lexicon from disk)
        if _vader is None:
            from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

            _vader = SentimentIntensityAnalyzer()
    return [_vader.polarity_scores(t)["compound"] for t in texts]


# Concrete sensory vocabulary: colour, light, sound, touch/texture, temperature, smell/taste, size/shape, looks.
_DESCRIPTIVE = frozenset(
    """
red crimson scarlet blue azure navy green emerald yellow golden gold amber orange purple violet pink white ivory
black ebony grey gray silver brown pale dark bright vivid pallid rosy bronze copper
shining gleaming glittering sparkling glowing dim dusky shadowy shady sunlit moonlit misty foggy hazy murky
luminous radiant brilliant faint flickering twinkling translucent
loud quiet silent soft hushed shrill booming thunderous rustling creaking whispering echoing melodious
rough smooth silky velvety coarse prickly sharp jagged slick slippery sticky damp wet moist dry dusty muddy
soggy frosty icy cold chilly cool warm hot scorching sweltering balmy crisp brittle fluffy downy feathery
fragrant sweet sour bitter salty spicy savory musty stale pungent acrid smoky fresh rotten perfumed
huge vast enormous immense towering tiny little slender thin narrow wide broad tall squat plump round
curved crooked twisted gnarled hollow heavy delicate graceful sturdy massive
ancient weathered tattered ragged worn rusty polished gleaming ornate elegant shabby lush verdant barren
wild dense tangled wooden stone marble velvet satin lace leather woolen
beautiful lovely gorgeous exquisite handsome ugly grim gloomy cheerful serene tranquil stormy windy rainy
""".split()
)
# -ly words that are not manner adverbs
_NOT_ADVERBS = frozenset(
    "only family early likely really nearly daily lonely holy ugly jolly reply supply "
    "apply rely fly july italy belly bully silly lily ally".split()
)
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def descriptiveness_score(texts: list[str]) -> list[float]:
    """A transparent stand-in for "how descriptive is this continuation" (the paper's descriptiveness task used
    human labels; this heuristic lets the task run offline with a known ground truth).

    score = (d + 0.5 * a + 0.5 * s) / (n + 3), where, over the lower-cased words of the text,
      d = words in a small embedded list of concrete sensory adjectives (colour, light, sound, texture,
          temperature, smell/taste, size/shape),
      a = other words ending in "-ly" (manner adverbs such as "slowly"), minus a stoplist ("only", "family", ...),
      s = other words of >= 6 letters ending in an adjective suffix ("-ful", "-ous", "-ish", "-less", "-ive"),
      n = number of words.
    Dividing by the length makes it a density, so padding a response with filler does not pay, and the +3 keeps
    very short texts ("Red.") from scoring near 1. Scores lie in [0, 1); a typical sentence scores 0-0.2.
    """
    out = []
    for text in texts:
        words = _WORD.findall(text.lower())
        d = sum(w in _DESCRIPTIVE for w in words)
        a = sum(w.endswith("ly") and w not in _DESCRIPTIVE and w not in _NOT_ADVERBS and len(w) > 4 for w in words)
        s = sum(
            len(w) >= 6 and w not in _DESCRIPTIVE and w.endswith(("ful", "ous", "ish", "less", "ive")) for w in words
        )
        out.append((d + 0.5 * a + 0.5 * s) / (len(words) + 3))
    return out


# -- the summarization judge -----------------------------------------------------------------------------------

SUMMARY_FREE_WORDS = 10
"""Words a summary may use before the faithfulness judge's length penalty starts."""
LENGTH_PENALTY = 0.03
"""The judge's penalty per word beyond SUMMARY_FREE_WORDS. 0.03 beyond 10 (was 0.01 beyond 20): with 0.01 the four
summaries of a question differed by a median 0.053 (best minus second) and a reward model trained on 244 such labels
picked the judge's best 0.206 of the time (chance 0.25); docs/results.md, "Summarization demo"."""
_END_OF_TEXT = re.compile(r"<\|(?:im_end|endoftext)\|>")  # SmolLM2's and GPT-2's end-of-text tokens, decoded
_encoder = None
_encoder_lock = threading.Lock()
_article_cache: dict[str, Tensor] = {}


def embed(texts: list[str]):
    """all-MiniLM-L6-v2 sentence embeddings [n, 384], L2-normalized (the sentence-transformers recipe: mean of the
    last hidden states over real tokens; texts cut at 256 word pieces). CPU, fp32, no gradients."""
    import torch

    global _encoder
    with _encoder_lock:
        if _encoder is None:
            from transformers import AutoModel, AutoTokenizer

            d = str(minilm_dir())
            _encoder = (AutoTokenizer.from_pretrained(d), AutoModel.from_pretrained(d).eval())
    tok, enc = _encoder
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), 64):
            b = tok(texts[i : i + 64], padding=True, truncation=True, max_length=256, return_tensors="pt")
            h = enc(**b).last_hidden_state.float()  # [n, L, 384]
            m = b["attention_mask"].unsqueeze(-1).float()
            out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1))
    return torch.cat(out) if out else torch.zeros(0, 384)


def _need_minilm() -> None:
    minilm_dir()  # an AssetError naming the package to install, before any work


def summary_text(response: str) -> str:
    """What the faithfulness judge reads of a response: its first line, before any end-of-text token."""
    return _END_OF_TEXT.split(response)[0].lstrip().split("\n")[0].strip()


@reads_query
def faithfulness_score(summaries: list[str], articles: list[str]) -> list[float]:
    """A documented mock judge of summaries (the offline summarization demo's "human"):

        score = cos(e(summary), e(article)) - 0.03 * max(0, words(summary) - 10)

    where e is the all-MiniLM-L6-v2 sentence embedding (`embed`) and the article is the query text the policy was
    shown. The summary is the response's first line: up to the model's first end-of-text token (`<|im_end|>`/
    `<|endoftext|>`) and, after leading whitespace, up to the first line break (SmolLM2 answers 'TL;DR:' with a blank
    line, a paragraph, then often a blank line and a remark of another kind: "The original text was edited to...");
    an empty summary scores 0. The cosine rewards summaries about what the article says (a made-up event, a wrong
    subject or rambling off topic scores low; copying the article's own sentences scores high, the paper's "smart
    copier"); the penalty rewards saying it in few words. Scores are at most 1; an on-topic summary of 10 words scores
    0.5-0.8 against its article, the same content in 20 words 0.3 less."""
    import torch

    cut = [summary_text(s) for s in summaries]
    new = [a for a in dict.fromkeys(articles) if a not in _article_cache]
    if new:
        if len(_article_cache) > 4096:  # a bounded cache: articles recur across labels, rollouts and evaluations
            _article_cache.clear()
        _article_cache.update(zip(new, embed(new), strict=True))
    e_a = torch.stack([_article_cache[a] for a in articles]) if articles else torch.zeros(0, 384)
    e_s = embed(cut)
    cos = (e_s * e_a).sum(-1).tolist()
    out = []
    for c, s in zip(cos, cut, strict=True):
        words = len(s.split())
        out.append(0.0 if not words else c - LENGTH_PENALTY * max(0, words - SUMMARY_FREE_WORDS))
    return out


faithfulness_score.prepare = _need_minilm

SCORE_FNS: dict[str, ScoreFn] = {"vader": vader_score, "descriptiveness": descriptiveness_score,
                                 "faithfulness": faithfulness_score}  # fmt: skip


def score_fn(name: str) -> ScoreFn:
    """SCORE_FNS[name], once what it needs is there (the faithfulness judge's encoder): a missing asset is an
    AssetError before a command samples or writes anything, not after."""
    fn = SCORE_FNS[name]
    getattr(fn, "prepare", lambda: None)()
    return fn


def make_labeler(name: str, temperature: float = 0.0, random_rate: float = 0.0, seed: int = 0) -> ScoreLabeler:
    """A simulated labeler for a mock task: "vader" (sentiment), "descriptiveness" or "faithfulness" (summaries)."""
    if name not in SCORE_FNS:
        raise ValueError(f"unknown simulated labeler {name!r}; expected one of {sorted(SCORE_FNS)}")
    return ScoreLabeler(SCORE_FNS[name], temperature=temperature, random_rate=random_rate, seed=seed)


def label_items(
    store: LabelStore,
    labeler: ScoreLabeler,
    labeler_name: str,
    items: Iterable[Item] | None = None,
    *,
    batch: str | None = None,
    limit: int | None = None,
) -> int:
    """Answer `items` (default: this labeler's queue in the store, `next_item(labeler_name, batch=batch)` until it is
    empty or `limit` labels were added) as `labeler_name`; items it already answered are passed over.
    Returns the number of labels added."""
    added = 0

    def queue() -> Iterable[Item]:
        while limit is None or added < limit:
            item = store.next_item(labeler_name, batch=batch)
            if item is None:
                return
            yield item

    for item in queue() if items is None else items:
        try:
            store.add_label(
                item.id,
                labeler_name,
                source=f"sim:{labeler_name}",
                **labeler.answer(item.label_type, item.query, item.samples),
            )
        except DuplicateLabelError:  # another process (or an earlier call) already answered it as this labeler
            continue
        added += 1
        if limit is not None and added >= limit:
            break
    return added
