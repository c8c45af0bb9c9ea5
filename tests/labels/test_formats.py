"""Label files: round trips through every format, whole-file rejection of malformed files, idempotent and atomic
imports. The original-format file is built here by encoding texts with the real GPT-2 BPE and padding with 50259."""

import json
import re

import pytest

from lmprefs.assets.tokenizers import gpt2_tokenizer
from lmprefs.labels import formats
from lmprefs.labels.formats import GPT2_PAD, LabelFileError, export_file, import_file
from lmprefs.labels.store import LabelStore

QUERIES = ["The old house at the end of the lane", "She walked home from the market", "It was a bright cold day"]
SAMPLES = [
    [" had been empty for years.", " was quiet.", " was quiet.", " burned down\nin 1990."],
    [" carrying a basket.", " and sang.", " in the rain, “happy”.", " slowly."],
    [" and the clocks struck.", " in April.", " for everyone.", " – or so it seemed."],
]
BEST = [3, 0, 2]


@pytest.fixture(scope="module")
def tok():
    return gpt2_tokenizer()


@pytest.fixture
def store(tmp_path):
    with LabelStore(tmp_path / "labels.db") as s:
        yield s


def pad(ids, n):
    return ids + [GPT2_PAD] * (n - len(ids))


def openai_rows(tok, query_length=16, response_length=12):
    rows = []
    for q, ss, best in zip(QUERIES, SAMPLES, BEST, strict=True):
        row = {"query": pad(tok.encode(q), query_length), "best": best}
        row.update({f"sample{i}": pad(tok.encode(s), response_length) for i, s in enumerate(ss)})
        rows.append(row)
    return rows


def write(path, rows, jsonl=False):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) if jsonl else json.dumps(rows))
    return path


def test_openai_format_round_trip(tmp_path, store, tok):
    rows = openai_rows(tok)
    rows.append(dict(rows[0]))  # an exact repeat stays a separate training row, as in the original
    src = write(tmp_path / "offline.json", rows)
    report = import_file(store, src, tokenizer=tok)
    assert (report.format, report.label_types, report.rows) == ("openai", ("best_of_4",), 4)
    assert (report.items_added, report.labels_added) == (4, 4)
    ex = store.labeled_examples("best_of_4", tokenizer="gpt2")
    assert [e.query for e in ex] == QUERIES + QUERIES[:1]  # decoded text, pads stripped
    assert [e.samples for e in ex] == SAMPLES + SAMPLES[:1] and [e.best for e in ex] == BEST + BEST[:1]
    assert ex[0].query_tokens == tok.encode(QUERIES[0]) and ex[1].sample_tokens[2] == tok.encode(SAMPLES[1][2])
    out = tmp_path / "out.json"
    assert export_file(store, out, format="openai", query_length=16, response_length=12) == 4
    assert json.loads(out.read_text()) == rows  # byte-for-byte the same ids, pads included
    again = import_file(store, src, tokenizer=tok)  # idempotent
    assert (again.items_added, again.labels_added, again.items_present, again.labels_present) == (0, 0, 4, 4)


def test_openai_scalar_types_and_limit(tmp_path, store, tok):
    rating = [
        {"query": pad(tok.encode(q), 10), "sample": tok.encode(s[0]), "score": k - 0.5}
        for k, (q, s) in enumerate(zip(QUERIES, SAMPLES, strict=True))
    ]
    report = import_file(store, write(tmp_path / "rating.json", rating), tokenizer=tok, limit=2)
    assert report.label_types == ("scalar_rating",) and report.rows == 2
    assert [e.score for e in store.labeled_examples("scalar_rating")] == [-0.5, 0.5]
    compare = [
        {"query": tok.encode(q), "sample0": tok.encode(s[0]), "sample1": tok.encode(s[1]), "difference": 1.5}
        for q, s in zip(QUERIES, SAMPLES, strict=True)
    ]
    import_file(store, write(tmp_path / "compare.json", compare), tokenizer=tok)
    out = tmp_path / "compare_out.json"
    export_file(store, out, format="openai", label_type="scalar_compare")
    assert [r["difference"] for r in json.loads(out.read_text())] == [1.5] * 3
    with pytest.raises(LabelFileError, match="has 3 rows, fewer than limit=5"):
        import_file(store, tmp_path / "compare.json", tokenizer=tok, limit=5)


def test_pairs_round_trip(tmp_path, store):
    rows = [{"prompt": "Q1", "chosen": "good", "rejected": "bad"}, {"prompt": "Q2", "chosen": "yes", "rejected": "no"}]
    src = write(tmp_path / "prefs.jsonl", rows, jsonl=True)
    report = import_file(store, src)
    assert (report.format, report.label_types, report.labels_added) == ("pairs", ("best_of_2",), 2)
    ex = store.labeled_examples("best_of_2")
    assert [(e.samples, e.best) for e in ex] == [(["good", "bad"], 0), (["yes", "no"], 0)]
    out = tmp_path / "pairs_out.jsonl"
    export_file(store, out, format="pairs")
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    assert import_file(store, src).labels_added == 0


def test_best_of_4_to_pairs(tmp_path, store, tok):
    import_file(store, write(tmp_path / "offline.json", openai_rows(tok)), tokenizer=tok)
    first, every = tmp_path / "first.jsonl", tmp_path / "all.jsonl"
    assert export_file(store, first, format="pairs", pairs="first") == 3
    # item 0: chosen = sample3, others are 3 texts of which 2 are equal -> 2 distinct rejected; items 1, 2: 3 each
    assert export_file(store, every, format="pairs", pairs="all") == 2 + 3 + 3
    rows = [json.loads(line) for line in first.read_text().splitlines()]
    assert rows[0] == {"prompt": QUERIES[0], "chosen": SAMPLES[0][3], "rejected": SAMPLES[0][0]}
    assert rows[1] == {"prompt": QUERIES[1], "chosen": SAMPLES[1][0], "rejected": SAMPLES[1][1]}


def test_comparisons_round_trip_with_labelers(tmp_path, store):
    rows = [
        {"query": "Q", "samples": ["a", "b", "c"], "best": 2, "labeler": "ann"},
        {"query": "Q", "samples": ["a", "b", "c"], "best": 1, "labeler": "bob"},  # same item, another labeler
        {"query": "R", "samples": ["x", "y"], "best": 0},
        {"query": "S", "samples": ["s"], "score": 0.25},
    ]
    src = write(tmp_path / "cmp.jsonl", rows, jsonl=True)
    report = import_file(store, src, labeler="me")
    assert report.label_types == ("best_of_2", "best_of_3", "scalar_rating") and report.items_added == 3
    assert store.agreement().pairs == {("ann", "bob"): (0.0, 1)}
    out = tmp_path / "cmp_out.jsonl"
    export_file(store, out, format="comparisons")
    back = [json.loads(line) for line in out.read_text().splitlines()]
    for r in rows:
        r.setdefault("labeler", "me")  # rows without one were imported as labeler="me"
    assert sorted(back, key=json.dumps) == sorted(rows, key=json.dumps)


def test_changed_answer_on_reimport_is_rejected(tmp_path, store):
    src = write(tmp_path / "cmp.jsonl", [{"query": "Q", "samples": ["a", "b"], "best": 0, "labeler": "ann"}], True)
    import_file(store, src)
    before = store.table_counts()
    write(
        src,
        [
            {"query": "Z", "samples": ["c", "d"], "best": 0},
            {"query": "Q", "samples": ["a", "b"], "best": 1, "labeler": "ann"},
        ],
        True,
    )
    with pytest.raises(LabelFileError, match="cmp.jsonl: labeler 'ann' already answered item 1"):
        import_file(store, src)
    assert store.table_counts() == before


def test_text_import_stores_tokens_when_given_a_tokenizer(tmp_path, store, tok):
    src = write(tmp_path / "cmp.jsonl", [{"query": "Hello", "samples": [" world", " there"], "best": 1}], jsonl=True)
    import_file(store, src, tokenizer=tok, tokenizer_name="gpt2")
    (ex,) = store.labeled_examples("best_of_2", tokenizer="gpt2")
    assert ex.query_tokens == [15496] and ex.sample_tokens == [[995], tok.encode(" there")]


def _malformed(tok):
    good = openai_rows(tok)
    missing = [dict(r) for r in good]
    del missing[1]["sample2"]
    extra = [dict(r) for r in good]
    extra[2]["sample4"] = extra[2]["sample0"]
    vocab = [dict(r) for r in good]
    vocab[1]["sample1"] = [50300, *vocab[1]["sample1"][1:]]
    best = [dict(r) for r in good]
    best[2]["best"] = 5
    cmp_ok = {"query": "Q", "samples": ["a", "b"], "best": 1}
    pair_ok = {"prompt": "P", "chosen": "c", "rejected": "r"}
    return [  # (file name, rows or raw text, jsonl?, kwargs, expected message)
        ("missing.json", missing, False, {}, r"missing.json row 1: missing field 'sample2'"),
        ("extra.json", extra, False, {}, r"extra.json row 2: field 'sample4' is not a best_of_4 field"),
        ("vocab.json", vocab, False, {}, r"vocab.json row 1: field 'sample1' token 0 = 50300 is outside"),
        ("best.json", best, False, {}, r"best.json row 2: field 'best' = 5 is out of range 0\.\.3"),
        ("broken.json", json.dumps(good)[:-40], False, {}, r"broken.json: invalid JSON at line 1"),
        ("p_missing.jsonl", [pair_ok, {"prompt": "P", "chosen": "c"}], True, {}, r"line 2: missing field 'rejected'"),
        ("p_chat.jsonl", [pair_ok, {**pair_ok, "chosen": [{"role": "user"}]}], True, {}, r"line 2: field 'chosen'"),
        ("p_broken.jsonl", json.dumps(pair_ok) + "\n{oops\n", None, {}, r"p_broken.jsonl line 2: invalid JSON"),
        (
            "c_best.jsonl",
            [cmp_ok, {**cmp_ok, "best": 2}],
            True,
            {},
            r"line 2: field 'best' = 2 is out of range 0\.\.1",
        ),
        (
            "c_n.jsonl",
            [cmp_ok, {**cmp_ok, "samples": ["a", "b", "c"]}],
            True,
            {"label_type": "best_of_2"},
            r"line 2: field 'samples' has 3 samples, best_of_2 needs 2",
        ),
        ("c_missing.jsonl", [cmp_ok, {"query": "Q", "best": 0}], True, {}, r"line 2: missing field 'samples'"),
        (
            "c_broken.jsonl",
            json.dumps(cmp_ok) + "\n" + json.dumps(cmp_ok)[:-1] + "\n",
            None,
            {},
            "line 2: invalid JSON",
        ),
    ]


def test_malformed_files_are_rejected_whole(tmp_path, store, tok):
    import_file(store, write(tmp_path / "seed.jsonl", [{"query": "Q0", "samples": ["a", "b"], "best": 0}], True))
    before = store.table_counts()
    for name, rows, jsonl, kwargs, msg in _malformed(tok):
        path = tmp_path / name
        path.write_text(rows) if isinstance(rows, str) else write(path, rows, jsonl)
        with pytest.raises(LabelFileError, match=msg):
            import_file(store, path, tokenizer=tok, **kwargs)
        assert store.table_counts() == before, name  # the good rows before the bad one were not stored either


def test_interrupted_import_leaves_store_unchanged(tmp_path, store, tok, monkeypatch):
    import_file(store, write(tmp_path / "first.jsonl", [{"prompt": "P", "chosen": "c", "rejected": "r"}], True))
    before = store.table_counts()
    calls = {"n": 0}
    real = LabelStore.add_label

    def crash_on_third(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # e.g. Ctrl-C mid-import, after two rows were written
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LabelStore, "add_label", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        import_file(store, write(tmp_path / "offline.json", openai_rows(tok)), tokenizer=tok)
    assert calls["n"] == 3 and store.table_counts() == before
    monkeypatch.undo()
    assert import_file(store, tmp_path / "offline.json", tokenizer=tok).labels_added == 3


def test_detect_format_and_atomic_export(tmp_path, store, tok):
    assert formats.detect_format(write(tmp_path / "a.json", openai_rows(tok))) == "openai"
    assert (
        formats.detect_format(write(tmp_path / "b.jsonl", [{"prompt": "p", "chosen": "c", "rejected": "r"}], True))
        == "pairs"
    )
    assert (
        formats.detect_format(write(tmp_path / "c.txt", [{"query": "q", "samples": ["a"], "score": 1}], True))
        == "comparisons"
    )
    with pytest.raises(LabelFileError, match=r"cannot tell the format .*\(--format on the command line, format= in"):
        formats.detect_format(write(tmp_path / "d.jsonl", [{"text": "hi"}], True))
    out = tmp_path / "out.jsonl"
    out.write_text("old")
    monkey_rows = store.labeled_examples  # an export that fails midway must leave the old file in place

    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    store.labeled_examples = boom
    with pytest.raises(RuntimeError):
        export_file(store, out, format="comparisons", label_type="best_of_2")
    store.labeled_examples = monkey_rows
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_trls_implicit_prompt_and_conversational_pairs_import_as_the_explicit_form(tmp_path, store):
    user = [{"role": "user", "content": "What color is the sky?"}]
    rows = [
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},  # implicit prompt
        {"prompt": user, "chosen": [{"role": "assistant", "content": "It is blue."}],
         "rejected": [{"role": "assistant", "content": "It is green."}]},
        {"chosen": [*user, {"role": "assistant", "content": "Blue."}],  # implicit conversational
         "rejected": [*user, {"role": "assistant", "content": "Green."}]},
    ]  # fmt: skip
    f = tmp_path / "trl.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert import_file(store, f).labels_added == 3
    got = [(e.query, e.samples, e.best) for e in store.labeled_examples("best_of_2")]
    assert got == [("The sky is", [" blue.", " green."], 0),
                   ("What color is the sky?", ["It is blue.", "It is green."], 0),
                   ("What color is the sky?", ["Blue.", "Green."], 0)]  # fmt: skip


@pytest.mark.parametrize("row,needle", [
    ({"prompt": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}],
      "chosen": [{"role": "assistant", "content": "Hello"}], "rejected": [{"role": "assistant", "content": "Go"}]},
     "line 1: the prompt is 2 message(s) with roles ['system', 'user']"),
    ({"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "user", "content": "Hello"}],
      "rejected": [{"role": "assistant", "content": "Go"}]}, "field 'chosen' must answer with one assistant message"),
    ({"prompt": [{"role": "user"}], "chosen": [], "rejected": []}, "field 'prompt' must be a list of messages"),
    ({"chosen": "same", "rejected": "same"}, "are the same text"),
])  # fmt: skip
def test_trl_rows_a_label_cannot_hold_are_refused_with_the_row(tmp_path, store, row, needle):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(row) + "\n")
    with pytest.raises(LabelFileError, match=re.escape(needle)):
        import_file(store, f, format="pairs")
    assert store.labeled_examples("best_of_2") == []


def test_a_saved_trl_preference_dataset_imports_like_its_jsonl(tmp_path, store, capsys):
    import datasets

    from lmprefs.cli.dispatch import main

    rows = {"prompt": ["Q1", "Q2"], "chosen": ["good", "yes"], "rejected": ["bad", "no"]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "prefs"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "dict"))
    report = import_file(store, tmp_path / "prefs")
    assert (report.format, report.labels_added) == ("pairs", 2)
    assert [(e.query, e.samples, e.best) for e in store.labeled_examples("best_of_2")] == [
        ("Q1", ["good", "bad"], 0), ("Q2", ["yes", "no"], 0)]  # fmt: skip
    db = str(tmp_path / "cli.sqlite")
    assert main(["import-labels", f"{tmp_path / 'dict'}:train", "--db", db]) == 0
    capsys.readouterr()
    assert main(["import-labels", str(tmp_path / "dict"), "--db", str(tmp_path / "new.sqlite")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "dict: a DatasetDict with splits train; name one as" in err, err
    assert not (tmp_path / "new.sqlite").exists()


def test_pairs_export_of_a_label_type_it_cannot_hold_says_so(tmp_path, store):
    """A pairs file holds choices (best_of_N, rankings): asked for ratings it says that, and writes nothing."""
    out = tmp_path / "ratings.jsonl"
    with pytest.raises(LabelFileError, match="the pairs format holds best_of_N and ranking labels, not scalar_rating"):
        export_file(store, out, format="pairs", label_type="scalar_rating")
    assert not out.exists()
