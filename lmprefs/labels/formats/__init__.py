"""Label files in and out of the store. Three formats:

- "openai": the original release's label files (`labels/sentiment/offline_5k.json`, ...): ONE JSON list of dicts
  with GPT-2 token ids, queries and samples right-padded with pad id 50259 (train_reward.py:download_labels and
  label_types.py @cbfd210): best_of_N rows `query, sample0..sample{N-1}, best`; scalar_rating rows `query, sample,
  score`; scalar_compare rows `query, sample0, sample1, difference`. Pads are stripped, the ids decoded with the
  GPT-2 tokenizer, and both text and ids (under tokenizer name "gpt2") are stored.
- "pairs": TRL-style preference JSONL, one `{"prompt", "chosen", "rejected"}` per line, or any other of TRL's
  preference forms: an implicit prompt (full texts) or conversational messages (`trl_pairs`). Imported as best_of_2
  items with samples in the order [chosen, rejected] and best=0: the order is kept rather than shuffled because
  the reward model scores each sample on its own, so PickBest's loss does not depend on the position of the chosen
  sample. Exported from best_of_N labels with rejected = the first sample whose text differs from the chosen one
  (TRL's own conversion of these files, `pairs="first"`) or every distinct other sample (`pairs="all"`); from a
  ranking_K label, every pair the ranking implies (K(K-1)/2: each sample against every one ranked below it).
- "comparisons": plain text JSONL, one `{"query": str, "samples": [str, ...], "best": int, "labeler"?: str}`
  per line (`score` or `difference` instead of `best` for the scalar types, `ranking`: [int, ...], every sample's
  index best first, for ranking_K), and `"confidence": 1..3` where the labeler gave one.
A ranking_K label exported as "openai" is a best_of_K row whose `best` is the ranking's top choice.
- "summarize" (import only): the comparison JSONL of the later summarization work (openai/summarize-from-feedback),
  one `{"info": {"post", "title"?, "subreddit"?} or {"article"}, "summaries": [{"text"}, {"text"}], "choice": 0|1,
  "worker": str, "split": str}` per line. Imported as best_of_2 items (samples in the file's order, best = choice)
  labeled by `worker`; the split is kept in the item's source, `import:FILE#SPLIT` (train, valid1, valid2). The query
  is the article, or the post as `lmprefs.data.summarize.comparison_query` writes it.
- "scores" (import only): per-response scores, one `{"prompt": str, "response": str, "score": number,
  "labeler"?: str}` per line (TRL's `completion` is read for `response`), such as Reddit comment scores of stories
  written for a prompt, or ratings. Imported as scalar_rating items (one sample each); train-reward regresses them or
  compares the responses to each prompt (labels.scores_as).

`readers` imports files (`import_file`, `detect_format`), `writers` exports them (`export_file`), `trl_pairs` reads
TRL's preference rows, and `shared` holds what both use.
"""

from lmprefs.labels.formats.readers import ImportReport, detect_format, import_file
from lmprefs.labels.formats.shared import FORMATS, GPT2_PAD, GPT2_VOCAB, IMPORT_FORMATS, LabelFileError
from lmprefs.labels.formats.writers import export_file

__all__ = [
    "FORMATS",
    "GPT2_PAD",
    "GPT2_VOCAB",
    "IMPORT_FORMATS",
    "ImportReport",
    "LabelFileError",
    "detect_format",
    "export_file",
    "import_file",
]
