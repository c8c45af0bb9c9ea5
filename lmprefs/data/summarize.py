"""Readers for the summarization tasks' data: the cleaning of the original's TL;DR posts (its JSON files are read
as prompt files, `lmprefs.data.prompt_files`), CNN/DM `.story` files
(lm_human_preferences/datasets/{tldr,cnndm}.py @cbfd210), and the comparison JSONL of the later summarization work
(openai/summarize-from-feedback, `comparisons/*.json`), which `lmprefs.labels.formats` imports as best_of_2 labels.

The texts come out cleaned as the original cleans them (ftfy, runs of 3+ newlines squeezed to one blank line, the
CNN/DM preamble and `@highlight` summaries dropped); cropping to query_length (cut at the last end_text within it) is
`queries.encode_query`'s job, the same for every dataset. Every error is a `SummaryDataError` (a `LabelFileError` for
comparisons) naming the file, the row and the field.
"""

from __future__ import annotations

import re
from pathlib import Path

import ftfy

from lmprefs.errors import UserError


class SummaryDataError(UserError):
    """A summarization file that cannot be read; the message names the file, the row and the field."""


def _fix_text(text: str) -> str:
    """ftfy.fix_text, as the original runs it: Reddit posts and news stories hold mojibake ('â€œ' for '“')."""
    return ftfy.fix_text(text)


def clean_tldr(text: str) -> str:
    """datasets/tldr.py: ftfy, squeeze 3+ newlines to a blank line, strip."""
    return re.sub(r"\n{3,}", "\n\n", _fix_text(text)).strip()


def clean_up_start(text: str) -> str:
    """The CNN/DM preamble stripped as datasets/cnndm.py:clean_up_start does: a 'By ...' byline (two lines), the
    '(CNN) --' / '(CNN)' dateline, a leading 'and NAME' line, the Daily Mail's 'UPDATED: hh:mm ... 20xx' header;
    curly single quotes become straight ones."""
    if text[:2] == "By":
        text = "\n".join(text.split("\n")[2:])
    text = re.split(r"\(CNN\) +--", text)[-1]
    text = re.split(r"\(CNN\)", text[:100])[-1] + text[100:]
    text = re.sub(r"^and \w+\n", "", text)
    # the original's pattern, character class and all ("[2011|2012|...]" matches one digit or '|')
    text = re.split(r".*UPDATED:\s+[0-9]{2}:[0-9]{2}.*[2011|2012|2013|2014|2015]", text)[-1]
    return text.replace("\u2019", "'").replace("\u2018", "'").strip()


def story_article(path: Path) -> str:
    """One `.story` file's article: preamble stripped, ftfy, 3+ newlines squeezed, everything from the first
    `@highlight` on dropped (datasets/cnndm.py:cnndm_generator). A file with no `@highlight` is not a CNN/DM story."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SummaryDataError(f"{path}: cannot read ({e})") from None
    if "@highlight" not in text:
        raise SummaryDataError(f"{path}: no '@highlight' line: not a CNN/DM .story file (article, then @highlight "
                               "summaries)")  # fmt: skip
    text = re.sub(r"\n{3,}", "\n\n", _fix_text(clean_up_start(text)))
    article = text.split("@highlight")[0].strip()
    if not article:
        raise SummaryDataError(f"{path}: the article before the first '@highlight' is empty")
    return article


def story_texts(path: Path) -> list[str]:
    """Articles of one `.story` file or of every `.story` file under a directory (sorted by path, so the order is
    the same on every machine; the query stream shuffles them per seed)."""
    files = sorted(path.rglob("*.story")) if path.is_dir() else [path]
    if not files:
        raise SummaryDataError(f"{path}: a directory with no .story files (expected CNN/DM stories)")
    return [story_article(f) for f in files]


# --------------------------------------------------------------------------------------------------------------
# summarize-from-feedback comparisons: {"info": {...}, "summaries": [{"text": ...}, {"text": ...}], "choice": 0|1,
# "worker": "...", "split": "train" | "valid1" | "valid2", ...}


def comparison_query(info: dict) -> str | None:
    """The question's text from a comparison's `info`: a news article as is; a Reddit post as 'SUBREDDIT: r/...',
    'TITLE: ...', 'POST: ...' paragraphs (the later work's prompt, without its '\\n\\nTL;DR:' suffix, which the
    tldr preset adds as task.query_suffix). None when `info` has neither `post` nor `article`."""
    if isinstance(info.get("article"), str):
        return info["article"]
    if not isinstance(info.get("post"), str):
        return None
    parts = []
    if isinstance(info.get("subreddit"), str):
        parts.append(f"SUBREDDIT: r/{info['subreddit']}")
    if isinstance(info.get("title"), str):
        parts.append(f"TITLE: {info['title']}")
    return "\n\n".join([*parts, f"POST: {info['post']}"])
