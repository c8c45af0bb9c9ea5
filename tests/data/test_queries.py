import json

import pytest
import torch

from lmprefs.config import TaskConfig
from lmprefs.data.queries import QueryDataError, QueryStream, build_queries, load_texts, task_queries
from lmprefs.data.tasks import PAD
from lmprefs.models.trunk import trunk_hidden


def test_start_and_end_text_trimming_as_the_original(tiny_lm):
    _, tok = tiny_lm
    task = TaskConfig(query_length=12, start_text=".", end_text=".")
    texts = ["Intro words. The first sentence. The second one is cut", "no period here at all", "Ends. here"]
    q = build_queries(texts, tok, task)
    assert len(q) == 1  # the second has no start token; the third has no end token after its start
    got = tok.decode([t for t in q[0].tolist() if t != PAD])
    assert got == " The first sentence."
    assert q.shape == (1, 12) and (q[0, len(tok(" The first sentence.").input_ids):] == PAD).all()


def test_queries_built_again_come_from_the_first_build_and_change_with_what_shapes_them(tiny_lm, monkeypatch):
    """build_queries remembers its result per tokenizer, texts and the fields that shape a query: a second build
    encodes nothing, a caller changing its copy does not reach the next, other texts or fields are built anew, and a
    tensor that could pass KEPT_BYTES is built every time."""
    _, tok = tiny_lm
    task = TaskConfig(query_length=12, start_text=".", end_text=".")
    texts = ["Intro words. The first sentence. The second one is cut", "A. B c d e. f"]
    first = build_queries(texts, tok, task)
    first[0, 0] = -7
    import lmprefs.data.queries as queries

    monkeypatch.setattr(queries, "_build_queries", lambda *a: pytest.fail("built again"))
    again = build_queries(list(texts), tok, task)
    assert (again != -7).all() and again.shape == (2, 12)
    monkeypatch.undo()
    shorter = build_queries(texts, tok, TaskConfig(query_length=4, start_text=".", end_text="."))
    assert shorter.shape == (1, 4)  # the first text's query does not end at a '.' within 4 tokens
    assert len(build_queries(texts[:1], tok, task)) == 1
    builds, real = [], queries._build_queries
    monkeypatch.setattr(queries, "_build_queries", lambda *a: builds.append(1) or real(*a))
    monkeypatch.setattr(queries, "KEPT_BYTES", 2 * 12 * 8 - 1)  # 2 texts x 12 tokens x 8 bytes: too large to keep
    assert torch.equal(build_queries(texts, tok, task), build_queries(texts, tok, task)) and len(builds) == 2


def test_padded_and_unpadded_queries_give_the_same_logits(tiny_lm):
    model, tok = tiny_lm
    ids = tok(" The first sentence of the book.").input_ids
    with torch.no_grad():
        plain = model.lm_head(trunk_hidden(model, torch.tensor([ids])))[0]
        padded = model.lm_head(trunk_hidden(model, torch.tensor([ids + [PAD] * 5, [PAD] * 5 + ids])))
    assert torch.allclose(padded[0, : len(ids)], plain, atol=1e-5)
    assert torch.allclose(padded[1, 5:], plain, atol=1e-5)


def test_stream_is_deterministic_per_seed_sharded_and_resumable():
    q = torch.arange(100).unsqueeze(1)
    a, b = QueryStream(q, seed=1), QueryStream(q, seed=1)
    assert a.next(30).equal(b.next(30))
    assert not QueryStream(q, seed=2).next(30).equal(QueryStream(q, seed=1).next(30))
    r0, r1 = QueryStream(q, seed=1, rank=0, world=2), QueryStream(q, seed=1, rank=1, world=2)
    x, y = set(r0.next(50).flatten().tolist()), set(r1.next(50).flatten().tolist())
    assert not x & y and len(x | y) == 100  # ranks see disjoint halves of an epoch
    s = QueryStream(q, seed=4)
    s.next(130)  # into the second epoch
    state = s.state_dict()
    t = QueryStream(q, seed=4)
    t.load_state_dict(state)
    assert s.next(40).equal(t.next(40))


def test_local_files_and_clear_errors(tmp_path, tiny_lm):
    _, tok = tiny_lm
    (tmp_path / "a.txt").write_text("First para. Has a sentence.\n\nSecond para. Another one.\n")
    assert load_texts(str(tmp_path / "a.txt")) == ["First para. Has a sentence.", "Second para. Another one."]
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": "x. y."}) + "\n")
    assert load_texts(f"{tmp_path / 'b.jsonl'}:body") == ["x. y."]
    with pytest.raises(QueryDataError, match="field 'text'"):
        load_texts(str(tmp_path / "b.jsonl"))
    with pytest.raises(QueryDataError, match="no such file"):
        load_texts(str(tmp_path / "missing.txt"))
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(QueryDataError, match="yields no queries"):
        task_queries(TaskConfig(query_dataset=str(tmp_path / "empty.txt")), tok, 1024)
    with pytest.raises(QueryDataError, match="exceeds the model's context of 64"):
        task_queries(TaskConfig(query_dataset="bundled", query_length=60), tok, 64)


def test_bundled_passages_yield_queries(tiny_lm):
    _, tok = tiny_lm
    train, heldout, prefix, suffix = task_queries(TaskConfig(query_dataset="bundled", query_length=16), tok, 64, 20)
    assert len(heldout) == 20 and len(train) > 100 and train.shape[1] == 16


def test_prompts_from_a_local_file_are_used_as_given_unless_cropping_is_asked_for(tmp_path, tiny_lm):
    import dataclasses

    _, tok = tiny_lm
    prompts = ["Mr. Darcy walked in. He", "A dragon with no period"]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts))
    (tmp_path / "p.txt").write_text("\n\n".join(prompts) + "\n")

    def queries(task):
        return [tok.decode([t for t in row if t != PAD]) for row in build_queries(load_texts(task.query_dataset), tok,
                                                                                   task).tolist()]  # fmt: skip

    for name in ("p.jsonl", "p.txt"):  # start_text and end_text '.', as the books presets set them
        task = TaskConfig(query_dataset=str(tmp_path / name), query_length=24, start_text=".", end_text=".")
        assert queries(task) == prompts
        assert queries(dataclasses.replace(task, crop_local_files=True)) == [" Darcy walked in."]
    # the built-in corpora are cropped as the original crops its book passages
    task = TaskConfig(query_dataset="bundled", query_length=24, start_text=".", end_text=".")
    assert all(q.rstrip().endswith(".") for q in queries(task))
