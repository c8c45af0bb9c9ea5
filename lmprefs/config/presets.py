"""The presets, named after the original's experiments (launch.py @cbfd210), and the CPU-scale ones built from them."""

from __future__ import annotations

import dataclasses

from lmprefs.config.schema import (
    Config,
    DPOConfig,
    LabelsConfig,
    LoraConfig,
    PPOConfig,
    RewardsConfig,
    RunConfig,
    SFTConfig,
    TaskConfig,
    TrainRewardConfig,
)

R = dataclasses.replace


BOOKS_TASK = TaskConfig(
    # The original's book passages are lost (openai/lm-human-preferences#17); the reproduction used bookcorpus.
    query_dataset="hf:bookcorpus:train:text",
    query_length=64,
    response_length=24,
    start_text=".",
    end_text=".",
    truncate_token=13,
    truncate_after=16,
    temperature=0.7,
    initial_model="gpt2",
    chat_template="false",  # the original's format: raw text, whatever the model
)


SUMMARIZE_TASK = TaskConfig(
    query_dataset="hf:trl-lib/tldr:train:prompt",
    query_length=500,
    response_length=75,
    start_text=None,
    end_text=None,
    query_suffix="\n\nTL;DR:",
    truncate_token=198,
    truncate_after=55,
    temperature=0.7,
    initial_model="gpt2",
    chat_template="false",
)


BOOKS_PPO = PPOConfig(total_episodes=1_000_000, batch_size=512, lr=1e-5)


SUMMARIZE_PPO = PPOConfig(total_episodes=1_000_000, batch_size=32, lr=2e-6, whiten_rewards=False)


BOOKS_REWARD = TrainRewardConfig(batch_size=32, lr=5e-5, rollout_batch_size=512)


SUMMARIZE_REWARD = TrainRewardConfig(batch_size=16, lr=2.5e-5, rollout_batch_size=128)


# The quickstart's offline task: SmolLM2-135M continuing Austen passages. Token 30 is '.' in SmolLM2's vocabulary.
AUSTEN_TASK = R(BOOKS_TASK, query_dataset="austen", initial_model="smollm2-135m", truncate_token=30)


SENTIMENT = Config(
    task=BOOKS_TASK,
    labels=LabelsConfig(num_train=4992, labeler="vader"),
    train_reward=BOOKS_REWARD,
    rewards=RewardsConfig(kl_coef=0.15, kl_target=6.0),
    ppo=BOOKS_PPO,
)


SUMMARIZE = Config(
    task=SUMMARIZE_TASK,
    # the original's labels came from people; the simulated labeler for summaries is the faithfulness judge
    labels=LabelsConfig(num_train=46000, labeler="faithfulness"),
    train_reward=SUMMARIZE_REWARD,
    rewards=RewardsConfig(kl_coef=0.03, kl_target=None),
    ppo=SUMMARIZE_PPO,
)


AUSTEN_SENTIMENT = Config(
    task=R(AUSTEN_TASK, query_length=32),
    labels=LabelsConfig(num_train=1000, labeler="vader"),
    # labeling samples 384 rows at a time: a decode step's fixed costs (its weights read once, ~1 s a batch on 2
    # cores) shared by more rows than 128, while the batch's KV cache (495 MB of SmolLM2's keys and values) keeps the
    # quickstart's peak RSS where it was (docs/results.md)
    train_reward=TrainRewardConfig(batch_size=16, lr=5e-5, rollout_batch_size=384, normalize_samples=128),
    rewards=RewardsConfig(kl_coef=0.15, kl_target=6.0, kl_horizon=10000),
    ppo=PPOConfig(total_episodes=64 * 30, batch_size=64, nminibatches=4, lr=1e-5),
    run=RunConfig(log_interval=5, save_interval=10),
)


# The offline summarization demo (`lmprefs quickstart --preset summarize`): the cnndm task's format (an 'Article:'
# prefix, a 'TL;DR:' suffix, temperature 0.5, best-of-4 labels, no reward whitening) on the ABC news articles of
# gensim's test data, with the quickstart's CPU sizing (LoRA in the top 8 blocks, a few hundred labels, 10 updates).
# Departures from cnndm, each for the 2-core budget or the model: queries are each article's first sentences within
# 64 tokens, its lead (cut at the last '.'; the original: 500 tokens cut at the last newline), summaries 32 tokens
# (75), and the quickstart's adaptive KL controller (target 6 nats) in place of cnndm's fixed beta 0.01, which was
# set for 1M episodes at lr 2e-6 of full fine-tuning, not for 320 episodes of LoRA at lr 1.5e-3.
# Truncation: cnndm's newline (token 198 in SmolLM2's vocabulary too) from index 2 instead of 55, and no penalty.
# SmolLM2 answers 'TL;DR:' with a blank line ('\n' '\n', indices 0-1: 2/3 of its samples), a paragraph, then in
# half of its samples a newline and a remark of another kind ("The original text was edited to..."); it emitted
# <|im_end|> in 62 of 1,600 samples. The judge reads the first line (labels/labelers.py:summary_text), and the cut
# makes the reward model read the same tokens (before, it read 32 tokens whatever the judge read) and lets the
# policy end a summary early. No penalty: half the samples have no newline within 32 tokens.
SUMMARIZE_DEMO = Config(
    task=TaskConfig(query_dataset="lee-news", query_length=64, query_prefix="Article:\n\n",
                    query_suffix="\n\nTL;DR:", start_text=None, end_text=".", response_length=32,
                    truncate_token=198, truncate_after=2, penalty_reward_value=None, temperature=0.5,
                    initial_model="smollm2-135m", chat_template="false"),
    # 360 labels (400 questions), 3 epochs as the quickstart: with the judge reading the first line and its length
    # penalty beyond 10 words, the reward model learns the judge well above chance; fewer labels and epochs, or the
    # judge reading whole responses, left it at chance (docs/results.md)
    labels=LabelsConfig(num_train=360, labeler="faithfulness"),
    train_reward=TrainRewardConfig(batch_size=16, lr=2e-3, epochs=3, rollout_batch_size=64, normalize_samples=64),
    rewards=RewardsConfig(kl_coef=0.15, kl_target=6.0, kl_horizon=10000),
    # 10 updates: the rollouts' true reward has risen most of its way by updates 5-9, and 10 keep the whole demo
    # near 20 minutes on 2 cores with the same gain as 20 (docs/results.md)
    ppo=PPOConfig(total_episodes=32 * 10, batch_size=32, nminibatches=2, noptepochs=4, lr=1.5e-3,
                  whiten_rewards=False),
    lora=LoraConfig(rank=8, alpha=16.0, layers=8),
    run=RunConfig(log_interval=5, save_interval=10, dtype="auto"),
)  # fmt: skip


# The offline instruct demo (`lmprefs quickstart --preset instruct`): SmolLM2-135M-Instruct (the smollm2-135m asset)
# answers requests in its own chat format and ends its answer itself. Prompts: an Austen sentence, cut as the
# quickstart cuts its queries (after a '.', at the last '.' within 32 tokens), framed inside the user turn as "A
# friend says to you: <sentence> / Reply to your friend briefly and kindly." (query_prefix, query_suffix):
# deterministic, offline, 3,883 of them, of which setup_task's fixed split holds out 512 as in every preset.
# Framed as a friend's words, more of the initial model's samples answered the sentence than with "Reply briefly
# and kindly to this remark: <sentence>", where it more often rewrote or ignored it (six samples of each, read).
# Kindness is VADER's positive sentiment of the answer text (read without the end-of-turn token); brevity is left
# to the model's own stopping and reported (the mean response length before and after), not rewarded: no built-in
# labeler scores length beside sentiment.
# stop_tokens empty: the tokenizer's EOS, which for this model is its template's end-of-turn token '<|im_end|>'
# (id 2; '<|endoftext|>', id 0, ends pretraining documents, not answers). 48 tokens: room for a short answer; the
# rest (labels, reward model, PPO, LoRA, the KL target) follows the quickstart.
INSTRUCT_DEMO = Config(
    task=TaskConfig(query_dataset="austen", query_length=32, query_prefix="A friend says to you:",
                    query_suffix="\n\nReply to your friend briefly and kindly.", start_text=".", end_text=".",
                    response_length=48, stop_at_eos=True, truncate_token=None, penalty_reward_value=None,
                    temperature=0.7, initial_model="smollm2-135m", chat_template="true"),
    labels=LabelsConfig(num_train=800, labeler="vader"),
    train_reward=TrainRewardConfig(batch_size=16, lr=2e-3, epochs=3, rollout_batch_size=64, normalize_samples=64),
    rewards=RewardsConfig(kl_coef=0.15, kl_target=6.0, kl_horizon=10000),
    ppo=PPOConfig(total_episodes=32 * 20, batch_size=32, nminibatches=2, noptepochs=4, lr=1.5e-3),
    lora=LoraConfig(rank=8, alpha=16.0, layers=8),
    run=RunConfig(log_interval=5, save_interval=10, dtype="auto"),
)  # fmt: skip


def _labeler(cfg: Config, name: str) -> Config:
    return R(cfg, labels=R(cfg.labels, labeler=name))


PRESETS: dict[str, tuple[str, Config]] = {
    "sentiment": (
        "The paper's sentiment task: GPT-2 124M continues book passages; 4,992 best-of-4 labels; adaptive KL, "
        "target 6.",
        SENTIMENT,
    ),
    "descriptiveness": (
        "The paper's descriptiveness task: as sentiment, with descriptiveness labels.",
        _labeler(SENTIMENT, "descriptiveness"),
    ),
    "tldr": (
        "TL;DR summarization: 500-token posts, 75-token summaries; fixed KL 0.03, no reward whitening.",
        SUMMARIZE,
    ),
    "cnndm": (
        "CNN/DM summarization: 'Article:' prefix, temperature 0.5; fixed KL 0.01, no reward whitening.",
        R(
            SUMMARIZE,
            task=R(SUMMARIZE_TASK, query_dataset="hf:abisee/cnn_dailymail:train:article", end_text="\n",
                   query_prefix="Article:\n\n", temperature=0.5),
            rewards=RewardsConfig(kl_coef=0.01, kl_target=None),
        ),  # fmt: skip
    ),
    "austen-sentiment": (
        "Offline mock sentiment: SmolLM2-135M continues Austen passages; VADER plays the human; sized for a CPU.",
        AUSTEN_SENTIMENT,
    ),
    "austen-descriptiveness": (
        "Offline mock descriptiveness: as austen-sentiment, with the descriptiveness heuristic as the labeler.",
        _labeler(AUSTEN_SENTIMENT, "descriptiveness"),
    ),
    "quickstart": (
        "The main job (`lmprefs quickstart`): austen-sentiment sized for a 2-core CPU: LoRA adapters in the top 8 "
        "blocks of one bf16-autocast base.",
        R(
            AUSTEN_SENTIMENT,
            # No truncation penalty: SmolLM2 seldom emits the bare '.' token (30) at positions 16-23, so with it most
            # rollouts scored -1 and PPO learned to place periods instead of sentiment; without it PPO raises the
            # true reward (docs/results.md).
            task=R(AUSTEN_SENTIMENT.task, truncate_token=None),
            # 800 labels: held-out best-of-4 accuracy grows with the labels (400 learn markedly less; the figures are
            # in docs/results.md). 3 epochs at lr 2e-3: more epochs overfit.
            labels=R(AUSTEN_SENTIMENT.labels, num_train=800),
            train_reward=R(AUSTEN_SENTIMENT.train_reward, lr=2e-3, epochs=3, normalize_samples=64),
            # lr 1.5e-3: with the 800-label reward model, 2e-3 overshot the KL target of 6 and 1.5e-3 stayed under it
            # (docs/results.md)
            ppo=PPOConfig(total_episodes=32 * 20, batch_size=32, nminibatches=2, noptepochs=4, lr=1.5e-3),
            lora=LoraConfig(rank=8, alpha=16.0, layers=8),
            # dtype auto: bf16 autocast where the CPU has native bf16, fp32 where bf16 would be emulated (several
            # times slower)
            run=R(AUSTEN_SENTIMENT.run, dtype="auto"),
        ),
    ),
    "writing-prompts": (
        "The writing-prompts recipe sized for a CPU (`lmprefs experiment writing-prompts`): SFT on the top-scored "
        "story per prompt, a reward model from the scores compared within each prompt, PPO from the SFT model with a "
        "separate value model; SmolLM2-135M with LoRA.",
        Config(
            # prompts are whole texts (no start/end cut); a story is scored on all its tokens
            # not one of the original's tasks: a model of your own with a chat template gets its chat format
            task=R(AUSTEN_TASK, query_dataset="austen", query_length=48, start_text=None, end_text=None,
                   truncate_token=None, chat_template="auto"),
            labels=LabelsConfig(type="scalar_rating", scores_as="comparisons", num_train=100_000,
                                heldout_fraction=0.1),
            train_reward=TrainRewardConfig(batch_size=16, lr=2e-3, epochs=3, rollout_batch_size=64,
                                           normalize_samples=64),
            rewards=RewardsConfig(kl_coef=0.15, kl_target=6.0, kl_horizon=10000),
            ppo=PPOConfig(total_episodes=32 * 20, batch_size=32, nminibatches=2, noptepochs=4, lr=1.5e-3,
                          value_model="separate", vf_lr=1.5e-3),
            lora=LoraConfig(rank=8, alpha=16.0, layers=8),
            sft=SFTConfig(epochs=2, batch_size=8, lr=1e-3),
            run=RunConfig(log_interval=5, save_interval=5, dtype="auto"),
        ),  # fmt: skip
    ),
    "summarize": (
        "Offline summarization demo: SmolLM2-135M summarizes 300 ABC news articles (lee-news); a MiniLM faithfulness "
        "judge plays the human; sized for a 2-core CPU.",
        SUMMARIZE_DEMO,
    ),
    "instruct": (
        "Offline instruct demo: SmolLM2-135M-Instruct, in its chat format, replies briefly and kindly to Austen "
        "sentences said by a friend and stops at '<|im_end|>'; VADER (kindness) plays the human; sized as the "
        "quickstart.",
        INSTRUCT_DEMO,
    ),
    "tiny": (
        "For tests: a tiny GPT-2 (2 layers, 32 dims; trained for seconds on the bundled passages) continuing those "
        "passages; seconds on a CPU; one PPO epoch an update (at 4 epochs, PPO raises VADER within 8 updates of 64).",
        Config(
            task=TaskConfig(
                query_dataset="bundled",
                query_length=24,
                response_length=8,
                # No truncation penalty: responses score the reward, not a constant -1 wherever '.' (13) is missing
                # at positions 4-7 (with the random model this preset used, nearly all of them:
                # test_tiny_preset_rollouts_score_the_reward_not_the_penalty)
                truncate_token=None,
                truncate_after=4,
                temperature=0.7,
                # not the random tiny-gpt2: it samples nearly uniformly from 50,257 tokens (2,001 distinct ones in
                # 256 responses), which spreads VADER's signal too thin for short runs to learn anything; this one
                # samples Austen's frequent words (286 distinct in the same 256)
                initial_model="tiny-gpt2-austen",
            ),
            labels=LabelsConfig(num_train=48, labeler="vader"),
            train_reward=TrainRewardConfig(batch_size=8, lr=1e-3, rollout_batch_size=16, normalize_samples=32),
            rewards=RewardsConfig(kl_coef=0.15, kl_target=6.0, kl_horizon=10000),
            # lr 3e-3 (was 1e-4): with --ppo.batch-size 64 --ppo.nminibatches 4 --ppo.noptepochs 4, VADER
            # (normalized) rises by 0.7-1.2 from the first 4 of 8 updates to the last 4 (seeds 0-3;
            # tests/training/test_policy.py); two updates of 16 and one epoch here for the tests of mechanics, which
            # are many: an epoch's second minibatch already steps a policy that has moved, and four epochs were most
            # of a tiny run's CPU time (docs/results.md)
            ppo=PPOConfig(total_episodes=32, batch_size=16, nminibatches=2, noptepochs=1, lr=3e-3),
            # the paper's lr 1e-6 and batch 64 (one step on 48 labels) moved this model by ~1e-5 nats; these move it
            # 0.4-0.5 nats in one epoch (experiment compare tiny, dpo.beta 0.03-0.3, both losses)
            dpo=DPOConfig(lr=2e-3, batch_size=8),
            run=RunConfig(log_interval=1, save_interval=1, device="cpu", dtype="float32", threads=1),
        ),
    ),
}


def preset(name: str) -> Config:
    """The preset called `name`; raises KeyError listing the presets that exist."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name][1]
