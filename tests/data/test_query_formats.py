"""task.query_dataset from a user's files (CSV, JSON lists, JSONL, text) and Hugging Face `datasets` (save_to_disk
directories, offline; the hub's error when unreachable): the texts read, what is cropped, and one-line errors."""

import dataclasses
import json

import pytest

from lmprefs.cli.dispatch import main
from lmprefs.config import TaskConfig
from lmprefs.data.queries import QueryDataError, build_queries, crops, load_texts
from lmprefs.data.tasks import PAD

PROMPTS = ["Mr. Darcy walked in. He", "A dragon, with no period", 'She said "yes"\nand left']


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(a Dataset directory, a DatasetDict directory) written by save_to_disk."""
    import datasets

    d = tmp_path_factory.mktemp("ds")
    one = datasets.Dataset.from_dict({"prompt": PROMPTS, "n": [1, 2, 3]})
    one.save_to_disk(str(d / "one"))
    other = datasets.Dataset.from_dict({"text": ["a held-out prompt"], "n": [4]})
    datasets.DatasetDict({"train": one, "test": other}).save_to_disk(str(d / "dict"))
    return d / "one", d / "dict"


def test_csv_json_and_jsonl_prompts_read_by_one_column_rule(tmp_path):
    import csv

    with open(tmp_path / "p.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "prompt", "text"])  # `text` comes first in the rule: text, prompt, content
        w.writerows([[i, "x", p] for i, p in enumerate(PROMPTS)])
    assert load_texts(str(tmp_path / "p.csv")) == PROMPTS
    assert load_texts(f"{tmp_path / 'p.csv'}:prompt") == ["x"] * 3
    (tmp_path / "s.json").write_text(json.dumps(PROMPTS))  # a JSON list of strings
    assert load_texts(str(tmp_path / "s.json")) == PROMPTS
    (tmp_path / "o.json").write_text(json.dumps([{"prompt": p, "id": 1} for p in PROMPTS]))
    assert load_texts(str(tmp_path / "o.json")) == PROMPTS
    (tmp_path / "o.jsonl").write_text("".join(json.dumps({"body": p}) + "\n" for p in PROMPTS))
    assert load_texts(f"{tmp_path / 'o.jsonl'}:body") == PROMPTS
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    assert load_texts(str(tmp_path / "s.jsonl")) == PROMPTS


def test_user_files_and_saved_datasets_are_used_as_given_unless_cropping_is_asked(tmp_path, saved, tiny_lm):
    _, tok = tiny_lm
    one, dct = saved
    (tmp_path / "p.csv").write_text("prompt\n" + "".join('"' + p.replace('"', '""') + '"\n' for p in PROMPTS))
    for spec in (str(tmp_path / "p.csv"), str(one), f"{dct}:train", f"hf:{one}"):
        task = TaskConfig(query_dataset=spec, query_length=24, start_text=".", end_text=".")
        assert not crops(task), spec
        got = [tok.decode([t for t in row if t != PAD]) for row in build_queries(load_texts(spec), tok, task).tolist()]
        assert got == PROMPTS, spec
        assert crops(dataclasses.replace(task, crop_local_files=True))
    assert crops(TaskConfig(query_dataset="hf:some/hub-dataset")) and crops(TaskConfig(query_dataset="bundled"))


def test_saved_dataset_splits_and_columns(saved):
    one, dct = saved
    assert load_texts(str(one)) == PROMPTS  # no `text` column: `prompt`
    assert load_texts(f"{dct}:test") == ["a held-out prompt"]
    assert load_texts(f"{dct}:train:prompt") == PROMPTS


@pytest.mark.parametrize(
    "spec, message",
    [
        ("{dict}", "a DatasetDict with splits train, test; name one as {dict}:SPLIT"),
        ("{dict}:valid", "no split 'valid' in {dict} (splits: train, test)"),
        ("{dict}:train:body", "no column 'body' (columns: prompt, n)"),
        ("{one}:body", "no column 'body' (columns: prompt, n)"),
        ("{one}:n", "row 0 column 'n' is int, not text"),
        ("{one}:train:prompt", "a single Dataset (no splits); give at most 1 ':' part(s) after {one}"),
    ],
)
def test_bad_saved_dataset_specs_name_the_value_and_what_there_is(saved, spec, message):
    one, dct = saved
    spec, message = (s.format(one=one, dict=dct) for s in (spec, message))
    with pytest.raises(QueryDataError) as e:
        load_texts(spec)
    assert str(e.value).startswith(f"task.query_dataset={spec!r}: ") and message in str(e.value), str(e.value)


def test_bad_files_are_one_line_naming_the_file_and_line(tmp_path):
    (tmp_path / "p.csv").write_text("id,body\n1,hello\n")
    with pytest.raises(QueryDataError, match=r"p.csv header: no field 'text', 'prompt', 'content' \(has: id, body\)"):
        load_texts(str(tmp_path / "p.csv"))
    with pytest.raises(QueryDataError, match=r"p.csv: no column 'title' \(columns: id, body\)"):
        load_texts(f"{tmp_path / 'p.csv'}:title")
    (tmp_path / "q.csv").write_text("prompt,id\nhello,1\nworld\n")
    with pytest.raises(QueryDataError, match=r"q.csv line 3: 1 cells, the header has 2"):
        load_texts(str(tmp_path / "q.csv"))
    (tmp_path / "l.json").write_text(json.dumps(["fine", 3]))
    with pytest.raises(QueryDataError, match=r"l.json row 1: expected a string or an object, got int"):
        load_texts(str(tmp_path / "l.json"))
    (tmp_path / "a.txt").write_text("a prompt\n")
    with pytest.raises(QueryDataError, match="a plain text file has no fields"):
        load_texts(f"{tmp_path / 'a.txt'}:text")


def test_cli_bad_datasets_are_one_line_exit_2_and_write_nothing(tmp_path, saved, capsys, monkeypatch):
    import datasets

    # the hub unreachable: offline mode as the suite runs (and the socket guard of conftest behind it)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    _, dct = saved
    for spec, message in [
        ("hf:someone/prompts:train:text", "task.query_dataset='hf:someone/prompts:train:text': cannot load "
         "'someone/prompts' split 'train' from the Hugging Face hub"),
        (f"{dct}:valid", f"task.query_dataset='{dct}:valid': no split 'valid' in {dct} (splits: train, test)"),
    ]:  # fmt: skip
        run = tmp_path / "run"
        rc = main(["train-policy", "tiny", "--reward", "vader", "--task.query-dataset", spec, "--run-dir", str(run)])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and message in err, err
        assert not run.exists()


def test_datasets_is_a_declared_dependency():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert any(d.replace(" ", "").startswith("datasets>=3") for d in pyproject["project"]["dependencies"])
