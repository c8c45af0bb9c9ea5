"""Summarization data: the original's TL;DR JSON and CNN/DM .story readers, their cropping into queries, the
summarize-from-feedback comparison import, and one-line errors for bad files. Fixtures are written here."""

import dataclasses
import json

import pytest
import torch

from lmprefs.cli.dispatch import main
from lmprefs.config import preset
from lmprefs.data.queries import QueryDataError, build_queries, load_texts, task_queries
from lmprefs.data.summarize import SummaryDataError, story_article
from lmprefs.data.tasks import PAD
from lmprefs.labels.formats import LabelFileError, import_file
from lmprefs.labels.store import LabelStore
from lmprefs.training.reward import heldout_mask

POSTS = [
    "I (24F) adopted a cat last week.\n\n\n\nShe hides under the bed all day and only eats at night. Is this normal?",
    "My landlord wants to raise the rent by 30% and says I have to sign by Friday. What are my options here?",
]
STORY = (
    "By . Jane Reporter . \nPUBLISHED: . 12:00 EST, 1 May 2014 . \n\n"  # the Daily Mail byline: 2 lines, dropped
    "LONDON, England (CNN) -- The city council voted on Monday to close the old bridge.\n"
    "Engineers found cracks in two of its supports.\n\n\n\n"
    "The bridge will reopen next year after repairs costing four million pounds.\n\n"
    "@highlight\n\nCouncil closes the old bridge\n\n@highlight\n\nRepairs cost four million pounds\n"
)


def _task(name, **kw):
    cfg = preset(name)
    return dataclasses.replace(cfg.task, **kw)


def test_tldr_json_posts_become_cropped_queries(tmp_path, tiny_lm):
    _, tok = tiny_lm
    path = tmp_path / "train-subset.json"
    path.write_text(json.dumps([{"content": p, "id": i} for i, p in enumerate(POSTS)]))
    texts = load_texts(str(path))
    # as datasets/tldr.py: 3+ newlines squeezed to one blank line, stripped
    assert texts[0] == POSTS[0].replace("\n\n\n\n", "\n\n") and texts[1] == POSTS[1]
    task = _task("tldr", query_dataset=str(path), query_length=12)
    train, _, prefix, suffix = task_queries(task, tok, 1024)
    assert train.shape == (2, 12) and prefix == [] and tok.decode(suffix) == "\n\nTL;DR:"
    # tldr has no end_text: the original only truncates to query_length
    got = {tuple(t for t in row if t != PAD) for row in train.tolist()}
    assert got == {tuple(tok(t).input_ids[:12]) for t in texts}
    # the same posts as JSONL, one object per line
    (tmp_path / "posts.json").write_text("".join(json.dumps({"content": p}) + "\n" for p in POSTS))
    assert load_texts(str(tmp_path / "posts.json")) == texts


def test_cnndm_story_preamble_and_highlights_stripped_and_cropped_at_a_newline(tmp_path, tiny_lm):
    _, tok = tiny_lm
    (tmp_path / "cnn" / "stories").mkdir(parents=True)
    (tmp_path / "cnn" / "stories" / "a.story").write_text(STORY)
    (tmp_path / "cnn" / "stories" / "b.story").write_text("(CNN)Short news.\nSecond line.\n\n@highlight\n\nShort\n")
    article = story_article(tmp_path / "cnn" / "stories" / "a.story")
    assert article == (
        "The city council voted on Monday to close the old bridge.\nEngineers found cracks in two of its supports.\n\n"
        "The bridge will reopen next year after repairs costing four million pounds."
    )
    assert load_texts(str(tmp_path)) == [article, "Short news.\nSecond line."]  # a directory: every .story, sorted
    task = _task("cnndm", query_dataset=str(tmp_path), query_length=30)
    queries = build_queries(load_texts(task.query_dataset), tok, task)
    texts = [tok.decode([t for t in row if t != PAD]) for row in queries.tolist()]
    # cropped to 30 tokens, then cut after the last '\n' within them (end_text, as language/datasets.py)
    first = "The city council voted on Monday to close the old bridge.\nEngineers found cracks in two of its supports."
    assert texts[0] == first + "\n\n"
    assert len(tok(texts[0]).input_ids) <= 30 < len(tok(article).input_ids)
    assert texts[1] == "Short news.\n"
    assert tok.decode(tok(task.query_prefix).input_ids) == "Article:\n\n"


def test_bad_summarization_files_name_file_row_and_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"content": "ok"}, {"body": "no content"}]))
    with pytest.raises(QueryDataError, match=r"bad.json row 1: missing field 'content'"):
        load_texts(str(bad))
    (tmp_path / "nohl.story").write_text("An article with no summaries.\n")
    with pytest.raises(SummaryDataError, match=r"nohl.story: no '@highlight' line"):
        load_texts(str(tmp_path / "nohl.story"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SummaryDataError, match="no .story files"):
        load_texts(str(tmp_path / "empty"))


def comparison(post="My cat hides all day.", choice=1, worker="w1", split="train", **kw):
    row = {
        "info": {"id": "t3_x", "post": post, "title": "Cat hides", "subreddit": "cats"},
        "summaries": [{"text": " cat hides", "policy": "sup"}, {"text": " new cat is shy", "policy": "ref"}],
        "choice": choice,
        "worker": worker,
        "batch": "batch3",
        "split": split,
    }
    return {**row, **kw}


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_summarize_comparisons_import_as_best_of_2_with_worker_and_split(tmp_path):
    rows = [comparison(), comparison(choice=0, worker="w2", split="valid1"),
            comparison(post="x", worker="w1", info={"id": "c1", "article": "The article text."})]  # fmt: skip
    path = write_jsonl(tmp_path / "batch3.json", rows)
    with LabelStore(tmp_path / "labels.db") as store:
        report = import_file(store, path)
        assert report.format == "summarize" and report.labels_added == 3 and report.label_types == ("best_of_2",)
        ex = store.labeled_examples("best_of_2")
        assert [(e.labeler, e.best) for e in ex] == [("w1", 1), ("w2", 0), ("w1", 1)]
        assert ex[0].query == "SUBREDDIT: r/cats\n\nTITLE: Cat hides\n\nPOST: My cat hides all day."
        assert ex[0].samples == [" cat hides", " new cat is shy"] and ex[2].query == "The article text."
        sources = [store.get_item(e.item_id).source for e in ex]
        assert sources == ["import:batch3.json#train", "import:batch3.json#valid1", "import:batch3.json#train"]
        assert import_file(store, path).labels_added == 0  # a second import adds nothing


@pytest.mark.parametrize(
    "row, message",
    [
        (comparison(choice=2), r"c.json line 2: field 'choice' = 2 is out of range 0..1"),
        ({k: v for k, v in comparison().items() if k != "worker"}, r"c.json line 2: missing field 'worker'"),
        (comparison(summaries=[{"text": "a"}, {"txt": "b"}]), r"c.json line 2 summaries\[1\]: missing field 'text'"),
        (comparison(info={"id": "x"}), r"c.json line 2: field 'info' has neither a 'post' nor an 'article'"),
        (comparison(split="valid 1"), r"c.json line 2: field 'split' = 'valid 1' is not a split name"),
        ('{"info": {"post": "p"}, "summaries": [', r"c.json line 2: invalid JSON"),
    ],
)
def test_bad_comparisons_are_one_line_exit_2_and_store_nothing(tmp_path, capsys, row, message):
    path = write_jsonl(tmp_path / "c.json", [comparison(), row])
    with LabelStore(tmp_path / "labels.db") as store, pytest.raises(LabelFileError, match=message):
        import_file(store, path, format="summarize")
    db = tmp_path / "cli.db"
    assert main(["import-labels", str(path), "--db", str(db), "--format", "summarize"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "c.json line 2" in err
    with LabelStore(db) as store:
        assert store.table_counts()["labels"] == 0 and store.table_counts()["items"] == 0


def test_cli_bad_query_file_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "posts.json"
    bad.write_text(json.dumps([{"content": "fine"}, {"title": "no content"}]))
    args = ["sample", "--preset", "tldr", "--task.initial-model", "tiny-gpt2", "--task.query-length", "16",
            "--task.response-length", "8", "--task.query-dataset", str(bad)]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "posts.json row 1: missing field 'content'" in err


def _split_rows(n_train, n_valid):
    """Distinct comparisons: n_train of split train, then n_valid of valid1 (workers w0..w2)."""
    return [comparison(post=f"Post number {k}: my cat hides.", choice=k % 2, worker=f"w{k % 3}",
                       split="train" if k < n_train else "valid1") for k in range(n_train + n_valid)]  # fmt: skip


def _heldout(store, tok, **labels):
    """(item of each label, held out, what that measures) under the tiny preset for best_of_2 and `labels`."""
    from lmprefs.pipeline.reward_model import heldout_labels, load_examples

    cfg = preset("tiny")
    cfg = dataclasses.replace(cfg, labels=dataclasses.replace(cfg.labels, type="best_of_2", **labels))
    data = load_examples(cfg, store, tok)
    return (data.items, *heldout_labels(cfg, store, data))


def test_imported_split_decides_the_heldout_labels_and_hash_mode_ignores_it(tmp_path, tiny_lm):
    tok = tiny_lm[1]
    with LabelStore(tmp_path / "l.db") as store:
        import_file(store, write_jsonl(tmp_path / "c.jsonl", _split_rows(12, 6)))
        splits = store.item_splits()
        assert sorted(splits.values()) == ["train"] * 12 + ["valid1"] * 6
        items, held, measured = _heldout(store, tok)
        valid = {i for i, s in splits.items() if s == "valid1"}
        assert {i for i, h in zip(items.tolist(), held.tolist(), strict=True) if h} == valid and measured == "valid1"
        # hash: today's split, by the hash of the item ids alone
        items, held, measured = _heldout(store, tok, heldout_by="hash", heldout_fraction=0.5)
        assert torch.equal(held, heldout_mask(items, preset("tiny").run.seed, 0.5)) and measured == "hash"
        # a mixed store: labels without a split (a plain comparisons file) fall back to the hash under auto
        plain = [{"query": f"Plain query {k}.", "samples": ["a", "b"], "best": 0} for k in range(40)]
        import_file(store, write_jsonl(tmp_path / "plain#1.jsonl", plain))  # a '#' in a file name is no split
        items, held, measured = _heldout(store, tok, heldout_fraction=0.5)
        by_hash = heldout_mask(items, preset("tiny").run.seed, 0.5).tolist()
        want = [i in valid if i in splits else h for i, h in zip(items.tolist(), by_hash, strict=True)]
        assert len(items) == 58 and held.tolist() == want and measured == "hash,valid1"


def test_train_reward_trains_on_the_train_split_and_reports_valid1(tmp_path, capsys):
    path = write_jsonl(tmp_path / "comparisons.jsonl", _split_rows(12, 6))
    db = tmp_path / "l.sqlite"
    assert main(["import-labels", str(path), "--db", str(db), "--format", "summarize"]) == 0
    args = ["train-reward", "tiny", "--db", str(db), "--labels.type", "best_of_2"]
    assert main([*args, "--run-dir", str(tmp_path / "r")]) == 0
    assert "held-out (6 labels, valid1): accuracy" in capsys.readouterr().out
    s = json.loads((tmp_path / "r" / "reward_model" / "lmprefs.json").read_text())["summary"]
    assert (s["labels_train"], s["labels_heldout"], s["heldout/n"], s["heldout/split"]) == (12, 6, 6, "valid1")
    assert main([*args, "--labels.num-train", "5", "--run-dir", str(tmp_path / "r5")]) == 0  # num_train still caps
    s = json.loads((tmp_path / "r5" / "reward_model" / "lmprefs.json").read_text())["summary"]
    assert (s["labels_train"], s["heldout/n"], s["heldout/split"]) == (5, 6, "valid1")
    # labels.heldout_by=split on a store whose labels carry no split: one line, exit 2
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"query": "Q.", "samples": ["a", "b"], "best": 0}])
    db2 = tmp_path / "plain.sqlite"
    assert main(["import-labels", str(plain), "--db", str(db2)]) == 0
    capsys.readouterr()
    assert main(["train-reward", "tiny", "--db", str(db2), "--labels.type", "best_of_2",
                 "--labels.heldout-by", "split", "--run-dir", str(tmp_path / "r2")]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "labels.heldout_by=split: none of the 1 best_of_2 labels" in err
    assert main(["config", "tiny", "--labels.heldout-by", "valid"]) == 2
    assert "--labels.heldout-by 'valid': choose one of auto, hash, split" in capsys.readouterr().err


def test_posts_with_mojibake_are_repaired_by_ftfy_a_declared_dependency(tmp_path):
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert any(d.startswith("ftfy") for d in pyproject["project"]["dependencies"])
    path = tmp_path / "train-subset.json"
    path.write_text(json.dumps([{"content": "He said \u00e2\u20ac\u0153hi\u00e2\u20ac\x9d and left\u00e2\u20ac\u00a6 "
                                            "It\u00e2\u20ac\u2122s fine."}]))  # fmt: skip
    assert load_texts(str(path)) == ["He said \"hi\" and left\u2026 It's fine."]


def test_tldr_prompts_that_end_in_the_suffix_carry_it_once(tmp_path, tiny_lm):
    _, tok = tiny_lm
    # trl-lib/tldr's prompts (the tldr preset's dataset) already end in the preset's query_suffix
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"POST: {p}\n\nTL;DR:"}) + "\n" for p in POSTS))
    task = _task("tldr", query_dataset=f"{path}:prompt", query_length=64)
    train, _, prefix, suffix = task_queries(task, tok, 1024)
    tldr = tok("TL;DR").input_ids
    for row in train.tolist():
        ids = prefix + row + suffix
        hits = [i for i in range(len(ids)) if ids[i : i + len(tldr)] == tldr]
        assert len(hits) == 1 and hits[0] > len(prefix) + len(row) - 1  # once, after the padding
        assert tok.decode([t for t in row if t != PAD]).startswith("POST: ")
