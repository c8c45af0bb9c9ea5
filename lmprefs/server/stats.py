"""The admin page's numbers: answers per labeler, throughput, and agreement between labelers.

Throughput counts `label`s (not skips or flags) in the last hour and the last 24 hours, and a rate while active:
labels per hour of time spent labeling, where time spent is the sum of the gaps between a labeler's consecutive
answers that are shorter than IDLE_GAP (a longer gap is a break, not work). Imported files and simulated labelers
write all their labels within seconds; their active time is ~0, so their rate is shown as unknown instead of as a
huge number. The median gap is the typical seconds a person spends on one question (also unknown for a burst).
The totals row pools only the labelers whose own rate is known, so a row of bursts never adds up to a rate.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from lmprefs.config import label_type_shape
from lmprefs.labels.store import LabelStore

IDLE_GAP = 30 * 60  # seconds; a longer pause between two answers is a break
MIN_ACTIVE = 60  # seconds of active time below which a rate per hour means nothing


@dataclass(frozen=True)
class Throughput:
    labels: int  # all time
    last_hour: int
    last_day: int
    active_hours: float
    median_seconds: float | None  # median gap between consecutive answers (excluding breaks)

    timed_labels: int | None = None  # labels of the labelers behind active_hours (totals row); None: all `labels`

    @property
    def per_hour_active(self) -> float | None:
        n = self.labels if self.timed_labels is None else self.timed_labels
        return n / self.active_hours if self.active_hours * 3600 >= MIN_ACTIVE else None


@dataclass(frozen=True)
class LabelerRow:
    name: str
    is_admin: bool
    has_token: bool
    label: int
    skip: int
    flag: int
    last_answer: float | None
    throughput: Throughput


def _throughput(answers: list[tuple[str, float]], gaps: list[float], now: float) -> Throughput:
    """`answers`: (kind, unix time); `gaps`: seconds between consecutive answers of the same labeler, breaks cut."""
    times = [t for kind, t in answers if kind == "label"]
    return Throughput(
        labels=len(times),
        last_hour=sum(t >= now - 3600 for t in times),
        last_day=sum(t >= now - 86400 for t in times),
        active_hours=sum(gaps) / 3600,
        median_seconds=statistics.median(gaps) if sum(gaps) >= MIN_ACTIVE else None,  # a burst is no person
    )


def labeler_rows(store: LabelStore, now: float | None = None) -> tuple[list[LabelerRow], Throughput]:
    """One row per registered labeler (with or without answers), and the totals over everyone."""
    now = time.time() if now is None else now
    rows, all_answers, timed_labels, timed_gaps = [], [], [], []
    for labeler, mine in store.labeler_activity():  # one snapshot, so the totals equal the sum of the rows
        gaps = [b - a for (_, a), (_, b) in zip(mine, mine[1:], strict=False) if b - a < IDLE_GAP]
        all_answers += mine
        counts = {k: sum(kind == k for kind, _ in mine) for k in ("label", "skip", "flag")}
        row = LabelerRow(
            labeler.name,
            labeler.is_admin,
            labeler.has_token,
            **counts,
            last_answer=mine[-1][1] if mine else None,
            throughput=_throughput(mine, gaps, now),
        )
        rows.append(row)
        if row.throughput.per_hour_active is not None:  # only labelers with a rate of their own
            timed_labels += mine
            timed_gaps += gaps
    total = _throughput(all_answers, [], now)
    timed = _throughput(timed_labels, timed_gaps, now)
    return rows, Throughput(total.labels, total.last_hour, total.last_day, timed.active_hours, timed.median_seconds,
                            timed.labels)  # fmt: skip


def chance_agreement(store: LabelStore) -> float | None:
    """Agreement two random labelers would reach on the store's best_of_N items (1/N; None if N differs)."""
    ns = {label_type_shape(t)[1] for t in store.label_types() if t.startswith("best_of_")}
    return 1 / ns.pop() if len(ns) == 1 else None


def ago(t: float | None, now: float | None = None) -> str:
    """'3 min ago' for the admin table."""
    if t is None:
        return "never"
    s = max(0.0, (time.time() if now is None else now) - t)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.0f} {unit} ago"
    return f"{s:.0f} s ago"
