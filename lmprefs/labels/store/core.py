"""`LabelStore`: one SQLite file (`base`: its connections and transactions) and the methods every other module asks
it by. The methods are plain functions of the store, kept in the modules named after what they touch or who asks
(`items`, `labels`, `labelers`, `reports`, `serving`, `selection`) and bound here, so callers write
`store.add_item(...)`.
"""

from __future__ import annotations

from collections.abc import Iterable

from lmprefs.labels.store import drift as _drift
from lmprefs.labels.store import items as _items
from lmprefs.labels.store import labelers as _labelers
from lmprefs.labels.store import labels as _labels
from lmprefs.labels.store import onboarding as _onboarding
from lmprefs.labels.store import reports as _reports
from lmprefs.labels.store import selection as _selection
from lmprefs.labels.store import serving as _serving
from lmprefs.labels.store.base import StoreBase
from lmprefs.labels.store.records import ImportCounts, ImportRow


class LabelStore(StoreBase):
    """A SQLite label store at `path` (created if missing). Safe to share between threads and processes."""

    # -- items (items.py) ------------------------------------------------------------------------------------

    add_item = _items.add_item
    get_item = _items.get_item
    search_items = _items.search_items
    next_item = _items.next_item
    pending_count = _items.pending_count
    item_count = _items.item_count
    item_batches = _items.item_batches
    item_splits = _items.item_splits
    label_types = _items.label_types
    table_counts = _items.table_counts
    set_gold = _items.set_gold
    set_hold = _items.set_hold

    # -- labels (labels.py) ----------------------------------------------------------------------------------

    add_label = _labels.add_label

    def import_batch(self, rows: Iterable[ImportRow]) -> ImportCounts:
        # a wrapper: import_batch takes its store as a Protocol, which mypy does not accept as a bound method's self
        return _labels.import_batch(self, rows)

    labeled_examples = _labels.labeled_examples
    has_answered = _labels.has_answered
    answer_counts = _labels.answer_counts
    answers_since = _labels.answers_since
    last_answer = _labels.last_answer

    # -- labelers (labelers.py) ------------------------------------------------------------------------------

    add_labeler = _labelers.add_labeler
    labeler_for_token = _labelers.labeler_for_token
    labeler_for_session = _labelers.labeler_for_session
    labelers = _labelers.labelers
    labelers_with_tokens = _labelers.labelers_with_tokens
    revoke_token = _labelers.revoke_token

    # -- onboarding (onboarding.py) ---------------------------------------------------------------------------

    onboarding_settings = _onboarding.onboarding_settings
    set_onboarding = _onboarding.set_onboarding
    practice_items = _onboarding.practice_items
    practice_answers = _onboarding.practice_answers
    set_admitted = _onboarding.set_admitted
    is_admitted = _onboarding.is_admitted
    is_held = _onboarding.is_held
    practice_summary = _onboarding.practice_summary

    # -- drift anchors (drift.py) ------------------------------------------------------------------------------

    anchor_every = _drift.anchor_every
    set_anchor_every = _drift.set_anchor_every
    set_anchor = _drift.set_anchor
    labeler_interval = _drift.labeler_interval
    due_anchors = _drift.due_anchors
    anchor_count = _drift.anchor_count
    last_anchor_answer = _drift.last_anchor_answer
    add_anchor_answer = _drift.add_anchor_answer
    drift = _drift.drift

    # -- what the admin page and the quality measures read (reports.py) --------------------------------------

    counts_by_labeler = _reports.counts_by_labeler
    agreement = _reports.agreement
    labeler_activity = _reports.labeler_activity
    recent_flags = _reports.recent_flags
    held_items = _reports.held_items
    gold_items = _reports.gold_items
    gold_accuracy = _reports.gold_accuracy
    best_of_answers = _reports.best_of_answers

    # -- what the web app's queue serves (serving.py) --------------------------------------------------------

    open_items = _serving.open_items
    open_count = _serving.open_count
    unanswered_gold = _serving.unanswered_gold
    servable = _serving.servable
    items_wanting_fewer = _serving.items_wanting_fewer
    set_want_labels = _serving.set_want_labels
    last_item_id = _serving.last_item_id

    # -- query selection: the queue's acquisition scores (selection.py) ---------------------------------------

    rankable_items = _selection.rankable_items
    set_acquisition = _selection.set_acquisition
    acquisition_by = _selection.acquisition_by
