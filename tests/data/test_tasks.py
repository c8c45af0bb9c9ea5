import torch

from lmprefs.config import TaskConfig
from lmprefs.data.tasks import PAD, apply_penalty, format_queries, passes_filter, show, truncate_responses

P = PAD


def test_truncate_after_first_token_at_or_after_index():
    r = torch.tensor([
        [5, 13, 6, 7, 13, 8, 13, 9],   # 13 at index 1 is too early; the first at >= 3 is index 4
        [13, 13, 13, 13, 1, 2, 3, 4],  # index 3 is the first at >= 3
        [1, 2, 3, 4, 5, 6, 7, 8],      # no 13: unchanged
        [1, 2, 3, 4, 5, 6, 7, 13],     # 13 at the very end: nothing after it
    ])  # fmt: skip
    out = truncate_responses(r, 13, 3)
    assert out.tolist() == [
        [5, 13, 6, 7, 13, P, P, P],
        [13, 13, 13, 13, P, P, P, P],
        [1, 2, 3, 4, 5, 6, 7, 8],
        [1, 2, 3, 4, 5, 6, 7, 13],
    ]
    assert passes_filter(out, 13, 3).tolist() == [True, True, False, True]
    assert truncate_responses(r, None, 3).equal(r) and passes_filter(r, None, 3).all()


def test_penalty_replaces_scores_of_responses_that_did_not_truncate():
    task = TaskConfig(truncate_token=13, truncate_after=2, penalty_reward_value=-1.0)
    post = truncate_responses(torch.tensor([[1, 2, 13, 4], [13, 1, 2, 3]]), 13, 2)
    assert apply_penalty(torch.tensor([0.5, 0.7]), post, task).tolist() == [0.5, -1.0]
    # penalty_reward_value None: truncation without the penalty (the summarization demo cuts at its newline)
    free = TaskConfig(truncate_token=13, truncate_after=2, penalty_reward_value=None)
    assert apply_penalty(torch.tensor([0.5, 0.75]), post, free).tolist() == [0.5, 0.75]


def test_reward_model_data_is_cut_as_the_task_cuts_responses():
    """Stored samples reach the reward model truncated as the task truncates rollouts (PAD after the token), so
    a store sampled before a truncation setting trains on what the judge read."""
    from lmprefs.labels.store import Example
    from lmprefs.training.reward import examples_to_comparisons

    ex = Example(label_id=1, item_id=1, label_type="best_of_2", labeler="x", query="q", samples=["a", "b"], best=0,
                 query_tokens=[5, 6],
                 sample_tokens=[[1, 13, 2, 3], [1, 2, 3, 4]])  # fmt: skip
    task = TaskConfig(query_length=3, response_length=4, truncate_token=13, truncate_after=0)
    data = examples_to_comparisons([ex], None, task)
    assert data.samples.tolist() == [[[1, 13, P, P], [1, 2, 3, 4]]] and data.queries.tolist() == [[5, 6, P]]


def test_format_queries_and_show():
    q = torch.tensor([[1, 2, P], [3, P, P]])
    assert format_queries(q, [9], [8, 7]).tolist() == [[9, 1, 2, P, 8, 7], [9, 3, P, P, 8, 7]]
    assert show("a\nb") == "a⏎b"
