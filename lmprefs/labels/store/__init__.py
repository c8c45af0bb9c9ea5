"""The label store: every query, sample, comparison question ("item"), labeler and judgement in one SQLite file.

One store serves the file importers (`formats`), the labeling web app and the reward trainer (offline, or online
with `labeled_examples(since_id=...)`). Every other module reads and writes it through `LabelStore`'s methods, so the
tables and their columns are known only here. Never imports torch.

- `schema`: the tables, the upgrades of an older file, opening a connection, checking a path given on the command line
- `records`: what the methods take and return (`Item`, `Example`, `Labeler`, ...) and the checks on written values
- `core`: `LabelStore`, its connections and transactions
- `items`, `labels`, `labelers`, `onboarding`, `drift`: the methods, by what they touch; `reports`: what the admin
  page and the quality measures read; `serving`: what the web app's queue asks; `selection`: the queue's
  acquisition scores
"""

from lmprefs.labels.store.core import LabelStore
from lmprefs.labels.store.items import ITEM_STATES
from lmprefs.labels.store.labelers import token_hash
from lmprefs.labels.store.records import (
    HOLDS,
    KINDS,
    SPLIT_NAME,
    Agreement,
    DuplicateLabelError,
    Example,
    ImportCounts,
    ImportRow,
    Item,
    Labeler,
    check_name,
    check_ranking,
    source_split,
)
from lmprefs.labels.store.schema import SCHEMA_VERSION, check_store_path

__all__ = [
    "HOLDS",
    "ITEM_STATES",
    "KINDS",
    "SCHEMA_VERSION",
    "SPLIT_NAME",
    "Agreement",
    "DuplicateLabelError",
    "Example",
    "ImportCounts",
    "ImportRow",
    "Item",
    "LabelStore",
    "Labeler",
    "check_name",
    "check_ranking",
    "check_store_path",
    "source_split",
    "token_hash",
]
