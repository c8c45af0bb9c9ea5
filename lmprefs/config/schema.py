"""Every knob of lmprefs as frozen dataclasses.

The tree and the names follow openai/lm-human-preferences (`lm_tasks.TaskHParams`, `train_reward.HParams`,
`train_policy.HParams`, `PpoHParams`, `RewardHParams`) so a reader can grep one against the other. Field docstrings
are the only documentation of a hyperparameter; `lmprefs <cmd> --help` prints them.
Overrides and (de)serialization live in `lmprefs.config.overrides`, the checks in `lmprefs.config.validate`,
the presets in `lmprefs.config.presets`; nothing here mutates a config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from lmprefs.config.validate import validate


@dataclass(frozen=True)
class TaskConfig:
    """What the policy continues and how responses are post-processed (lm_tasks.py:TaskHParams)."""

    query_dataset: str = "austen"
    """Where queries come from: `austen` or `lee-news` (offline assets: Austen's novels, 300 ABC news articles), a
    prompt file (.txt paragraphs; .jsonl, .json or .csv: `FILE[:FIELD]`, default field the first of text, prompt,
    content; a TL;DR .json is read by `content`), a `save_to_disk` directory (`DIR[:SPLIT][:FIELD]`), a CNN/DM
    .story file or directory of them, or `hf:NAME[:SPLIT[:FIELD]]` (split default train)."""
    query_length: int = 64
    """Query tokens after trimming; shorter queries are padded (the original right-pads with its pad id)."""
    query_prefix: str = ""
    """Text put before every query (cnndm: 'Article:\\n\\n')."""
    query_suffix: str = ""
    """Text put after every query (tldr/cnndm: '\\n\\nTL;DR:')."""
    start_text: str | None = "."
    """The query starts right after the first occurrence of this text; passages without it are skipped. Not applied
    to a prompt file or save_to_disk directory unless crop_local_files."""
    end_text: str | None = "."
    """The query is cut after the last occurrence of this text within query_length; passages without it are skipped.
    Not applied to a prompt file or save_to_disk directory unless crop_local_files."""
    crop_local_files: bool = False
    """Crop a local query_dataset (a .txt, .jsonl, .json or .csv file, a save_to_disk directory) with start_text and
    end_text too. Off: its texts are your prompts, used as given (cut to query_length tokens); the built-in corpora,
    hub datasets and CNN/DM .story files are always cropped."""
    response_length: int = 24
    """Tokens sampled for every response: exactly this many (the original), or at most this many with
    task.stop_at_eos."""
    stop_at_eos: bool = False
    """End each response at its first stop token (task.stop_tokens, or the tokenizer's EOS), which it keeps as its
    last token; the rest of the row is padding that PPO masks out (the KL penalty, the score on the last real token,
    whitening, GAE, the losses and their stats count real tokens only), and sampling stops once every row has
    stopped. Off: every response is response_length tokens long, as in the original and its presets. Responses that
    stop before a task.truncate_token get task.penalty_reward_value: pair it with truncate_token None or set the
    penalty to None."""
    stop_tokens: tuple[int, ...] = ()
    """With task.stop_at_eos: the token ids that end a response (comma-separated, e.g. `50256,198`); empty = the
    tokenizer's eos_token_id."""
    truncate_token: int | None = 13
    """Token id that ends a response for scoring (13 = '.' in GPT-2); None keeps the whole response."""
    truncate_after: int = 16
    """Truncate only at a truncate_token at index >= truncate_after."""
    penalty_reward_value: float | None = -1.0
    """Score given to responses with no truncate_token at index >= truncate_after; None keeps their score (the
    truncation then only decides what the reward model and the judge read)."""
    temperature: float = 0.7
    """Sampling temperature; logprobs are always computed at this temperature (policy.temperature)."""
    initial_model: str = "gpt2"
    """The pretrained LM: an asset name (smollm2-135m, tiny-gpt2, tiny-gpt2-austen), a local Hugging Face directory,
    or a hub name."""
    chat_template: Literal["auto", "true", "false"] = "auto"
    """Frame every query as an instruct model's chat turn. true: the tokenizer's chat template renders the query
    (with query_prefix and query_suffix) as a user turn followed by the assistant's generation prompt; the template's
    text before the query is put before it, the end of the turn and the assistant's header after it, so the policy
    and the reward model read the rendered turn, and samples, reports and labels keep the plain query text. false:
    the original's raw text. auto: true for a model of your own (a local directory or a hub name) whose tokenizer
    has a template; false for the bundled models (smollm2-135m, tiny-gpt2, tiny-gpt2-austen) and in the presets
    that reproduce the original's experiments (sentiment, descriptiveness, tldr, cnndm, austen-sentiment,
    austen-descriptiveness, quickstart, summarize), which set false so they keep raw text with any model; the
    instruct preset sets true."""


@dataclass(frozen=True)
class LabelsConfig:
    """Which judgments train the reward model, and who gives them."""

    type: str = "best_of_4"
    """Label type (label_types.py): best_of_N, ranking_K (a full order of K samples, K 2 to 9), scalar_rating or
    scalar_compare."""
    num_train: int = 4992
    """Labels used for one epoch of reward-model training (the original's books tasks use 4,992)."""
    source: str | None = None
    """Label source: a label store (.sqlite), an original label file (.json), pairwise JSONL, or a save_to_disk
    directory of such rows (`DIR`, `DIR:SPLIT`); None = the run's store."""
    labeler: str = "vader"
    """Simulated labeler used by `lmprefs label` and the quickstart: vader (sentiment), descriptiveness, or
    faithfulness (summaries: MiniLM similarity to the article minus a length penalty; labels/labelers.py)."""
    labeler_temperature: float = 0.0
    """Boltzmann-rational noise: the labeler picks softmax(score / T); 0 = always the best."""
    labeler_random_rate: float = 0.0
    """Probability that the simulated labeler answers uniformly at random (models inattentive labelers)."""
    heldout_fraction: float = 0.1
    """Fraction of labels held out from reward-model training to report accuracy and loss (labels.heldout_by)."""
    heldout_by: Literal["auto", "hash", "split"] = "auto"
    """Which labels are held out. hash: the items whose hash of (run.seed, item id) falls under
    labels.heldout_fraction. auto: items that carry an imported split (`import-labels --format summarize` keeps the
    file's `split`) train if it is `train` and are held out otherwise (valid1, valid2, ...); items without one go by
    the hash. split: as auto, but an error if no label carries a split."""
    subset_seed: int | None = None
    """Which num_train labels train the reward model: None, the first ones in store order; an int, a random
    num_train of the labels not held out, drawn with this seed (`experiment mock-sentiment --seeds` varies it)."""
    min_gold_accuracy: float = 0.0
    """Reward-model training drops every label of a labeler whose accuracy on gold questions (set in the labeling
    app) is below this; labelers who answered no gold question are kept. 0 keeps everyone."""
    weight_by_gold: bool = False
    """Weight each labeler's labels in the reward-model loss by their chance-corrected gold accuracy,
    (accuracy - 1/N) / (1 - 1/N) floored at 0 (a labeler at chance counts for nothing); labelers without gold answers
    weigh 1. Weights are scaled to mean 1 over the labels."""
    weight_by_confidence: bool = False
    """Weight each label in the reward-model loss by its labeler's confidence / 3 (given in the labeling app, 1 a
    guess to 3 sure; labels without one weigh 1), times the labels.weight_by_gold weight where both are set."""
    scores_as: Literal["rating", "comparisons"] = "rating"
    """How per-response scores (scalar_rating labels: imported comment scores or ratings, `import-labels --format
    scores`) train the reward model: rating = regress each score (the original's scalar_rating loss, MSE);
    comparisons = every two responses to the same prompt whose scores differ by more than labels.min_score_gap
    become a best_of_2 comparison won by the higher score (the best_of_N loss). Needs labels.type=scalar_rating."""
    min_score_gap: float = 0.0
    """labels.scores_as=comparisons: pairs whose scores differ by this much or less are dropped (0 drops ties)."""
    online_questions: int = 64
    """Online mode: questions (N continuations of one query by the current policy) queued per request."""
    online_interval: int = 5
    """Online mode: PPO updates between two requests for judgments."""
    online_retrains: int = 19
    """Online mode: reward-model retrains at evenly spaced updates after the first (the paper retrained 19 times)."""
    select: Literal["random", "bald", "spread"] = "random"
    """Which questions are asked (labels/acquisition.py): random, as sampled (the original); bald or spread, the top
    questions of a pool of labels.pool_factor times as many, ranked by a reward-model ensemble
    (train_reward.ensemble >= 2) trained on the labels so far: bald, the mutual information between the best-of-N
    choice and the member (Houlsby et al. 2011); spread, the members' std of each response's score relative to its
    question's mean, averaged over the responses. Applies to `lmprefs label` (in rounds of labels.select_round
    questions, the ensemble retrained after each), train-policy --online (each request picks among the current
    policy's candidates) and `lmprefs rank-queue` (the labeling app's pending items)."""
    pool_factor: float = 4.0
    """Directed selection (labels.select bald or spread): candidate questions sampled per question asked (>= 1; 1
    asks what random would)."""
    select_round: int = 64
    """`lmprefs label` with directed selection: questions asked per round, the ensemble retrained on every label so
    far before the next round is chosen. A store with fewer labels than this starts with a round of random ones."""
    select_diversity: float = 0.0
    """Directed selection: each question already chosen on the same query multiplies a candidate's acquisition by
    (1 - select_diversity), so that one query's questions do not take the whole round (0: the top ones; 1: a query
    again only when every other query is taken)."""


@dataclass(frozen=True)
class TrainRewardConfig:
    """Reward-model training (train_reward.py:HParams as bound by launch.py)."""

    batch_size: int = 32
    """Labels per optimizer step, summed over all workers."""
    lr: float = 5e-5
    """Peak Adam learning rate; decays linearly to 0 over training."""
    epochs: int = 1
    """Passes over the labels (the original makes one; small label sets learn more from a few)."""
    microbatch: int = 0
    """Questions per forward pass; their gradients add up to one batch_size step (0 = the whole batch at once).
    Lowers peak memory (a 16-question batch of 4 samples on SmolLM2 takes several GiB), not the result."""
    rollout_batch_size: int = 512
    """Rows per sampling batch of the initial policy: queries when sampling for normalization, questions x samples
    when sampling labeling questions."""
    normalize_samples: int = 256
    """Samples from the initial policy used to fit the reward gain and bias."""
    normalize_before: bool = True
    """Normalize rewards of initial-policy samples to mean 0, std 1 before training."""
    normalize_after: bool = True
    """Normalize again after training, so the KL coefficient always has the same meaning."""
    ensemble: int = 1
    """Reward models trained together as an ensemble (1: one reward model). Members differ by their initialization
    seed (derived from run.seed and the member's index; member 0 takes run.seed) and, with `bootstrap`, by their
    labels; with LoRA they share the frozen base and its frozen prefix. Scored by the mean of the members."""
    bootstrap: bool = False
    """Train each ensemble member on its own bootstrap resample of the training labels (drawn with replacement,
    as many as there are)."""


@dataclass(frozen=True)
class RewardsConfig:
    """The reward seen by PPO (train_policy.py:RewardHParams)."""

    kl_coef: float = 0.2
    """Initial KL penalty coefficient beta."""
    kl_target: float | None = None
    """Target KL in nats for the adaptive controller; None = fixed kl_coef (the original's adaptive_kl=None)."""
    kl_horizon: int = 10000
    """Adaptive controller horizon in episodes."""
    trained_model: str | None = None
    """A trained reward-model directory; None = train one first (as the original's train_new_model)."""
    normalize: bool = True
    """Normalize a reward model lmprefs did not train (no lmprefs.json beside it, e.g. TRL's) to mean 0, std 1 on
    initial-policy samples before using it, as lmprefs normalizes its own when it trains them (the original's
    set_reward_norm): kl_coef and the KL target are set for rewards of that scale. false: its raw scores. Either way
    the run prints the mean and std of its scores on those samples."""
    ensemble_reduce: Literal["mean", "min", "uwo"] = "mean"
    """How a reward-model ensemble's members' (each normalized) scores become the reward (Coste et al. 2023): mean;
    min, the worst member (WCO); uwo, the mean minus rewards.uwo_lambda times the members' variance. min and uwo
    need an ensemble (train_reward.ensemble > 1); with one member all three are its score."""
    uwo_lambda: float = 1.0
    """The variance weight lambda of rewards.ensemble_reduce=uwo (1.0 in Coste et al.'s PPO runs)."""


@dataclass(frozen=True)
class PPOConfig:
    """PPO (train_policy.py:PpoHParams)."""

    total_episodes: int = 2_000_000
    """Episodes over the whole run, summed over all workers."""
    batch_size: int = 64
    """Episodes per PPO update, summed over all workers."""
    nminibatches: int = 1
    """Minibatches per epoch; the original whitens rewards and advantages per minibatch."""
    noptepochs: int = 4
    """Passes over each rollout batch."""
    lr: float = 5e-6
    """Peak Adam learning rate; decays linearly to 0 over the run."""
    vf_coef: float = 0.1
    """Weight of the value loss."""
    cliprange: float = 0.2
    """PPO ratio clip."""
    cliprange_value: float = 0.2
    """Value prediction clip around the rollout's values."""
    gamma: float = 1.0
    """Discount."""
    lam: float = 0.95
    """GAE lambda."""
    whiten_rewards: bool = True
    """Whiten rewards (without shifting their mean) per minibatch before GAE."""
    value_model: Literal["shared", "separate"] = "shared"
    """shared: a zero-init value head on the policy's trunk (the original); separate: a value model of its own, a copy
    of the initial model (with LoRA: its own adapter on the shared base) with the head, trained by its own optimizer
    (ppo.vf_lr) and checkpointed beside the policy (the later summarization and writing-prompts work)."""
    vf_lr: float | None = None
    """Peak learning rate of a separate value model's own TF-style Adam (decays linearly to 0 with the policy's);
    None = ppo.lr. Only with ppo.value_model=separate: a shared trunk has one optimizer."""
    kl_stop: float = 50.0
    """Andon cord: stop the run when the mean KL (nats per episode) exceeds this."""
    score_drop_stop: float | None = 2.0
    """Andon cord: stop when the running mean score falls this far below its best (None = never)."""
    overoptimization_stop: float | None = None
    """Andon cord for over-optimization: stop when the running mean of a signal the reward model cannot fool falls
    this far below its best, in that signal's own units, while the reward model's score may still rise (None =
    never). The signals: the true reward (objective/true_reward, logged where one is known: quickstart, experiments,
    train-policy --true-reward); in an online run, the scoring reward model's agreement with labels on the policy's
    fresh samples that it was not trained on (online/rm_agreement, a fraction of questions); and, scored by a
    reward-model ensemble (train_reward.ensemble >= 2), the members' disagreement on the policy's own samples
    (objective/score_members_std, in reward-std units: each member is normalized to std 1), which warns by rising
    this far above its lowest running mean as the policy leaves the labels' distribution. An error all members
    share moves no signal but the true reward."""
    estimator: Literal["ppo", "rloo", "grpo", "dr_grpo", "reinforce_pp_baseline"] = "ppo"
    """ppo: the original's value head, GAE and clipped value loss. The group estimators answer each query with
    ppo.rloo_k samples, train no value model (the value head is left untrained) and use PPO's clipped ratio (per
    token; rloo: per ppo.rloo_ratio) with no reward whitening or GAE. rloo: REINFORCE leave-one-out (Ahmadian et al.
    2024), each sample's advantage its return (score - beta * summed KL) minus the mean of its query's other
    samples' returns. grpo
    (DeepSeekMath): the group-normalized advantage (r - mean) / (std + eps), each sequence's loss averaged over its own
    tokens, the KL per ppo.kl_in. dr_grpo (Dr. GRPO): r - mean without the std, each sequence's token sum divided by
    the constant response length. reinforce_pp_baseline (REINFORCE++-baseline): the score minus its group's mean, the
    KL penalty per token in the reward, returns-to-go whitened over the batch."""
    rloo_k: int = 2
    """With a group estimator (rloo, grpo, dr_grpo, reinforce_pp_baseline): samples per query (at least 2, dividing
    ppo.batch_size, which counts samples)."""
    rloo_ratio: Literal["token", "sequence"] = "token"
    """With ppo.estimator=rloo, which importance ratio is clipped. token: each token's, with its sequence's advantage
    on every token, averaged over tokens (PPO's loss; lmprefs' default). sequence: the whole response's,
    exp(sum_t log-ratio), one clipped term per sequence averaged over sequences, as TRL's RLOOTrainer; on-policy its
    gradient is the published RLOO's REINFORCE estimator with the response as one action."""
    kl_in: Literal["reward", "loss"] | None = None
    """Where grpo and dr_grpo put the KL to the reference: reward, lmprefs' k1 penalty beta * log(pi/pi_ref) taken
    from the return (as ppo and rloo do: an unbiased gradient of the KL-regularized objective); loss, the k3
    estimator pi_ref/pi - log(pi_ref/pi) - 1 per token added to the loss times beta (GRPO's paper; a biased
    gradient of that objective). With loss, beta (rewards.kl_coef, steered by the adaptive controller on the measured
    KL as the penalty is) weighs the k3 term and the return is the score alone. None: the estimator's own (grpo
    loss, dr_grpo reward); the other estimators take the KL in the reward only."""

    @property
    def samples_per_query(self) -> int:
        """k samples answer each query under a group estimator; PPO draws one per query."""
        return 1 if self.estimator == "ppo" else self.rloo_k

    @property
    def kl_in_loss(self) -> bool:
        """Whether the KL to the reference is a k3 term of the loss (grpo's default) rather than in the reward."""
        return (self.kl_in or ("loss" if self.estimator == "grpo" else "reward")) == "loss"

    @property
    def num_updates(self) -> int:
        return self.total_episodes // self.batch_size


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters on one frozen base (policy, value and reward as adapters; the reference is the bare base)."""

    rank: int = 0
    """Adapter rank; 0 = full fine-tuning (the original)."""
    alpha: float = 16.0
    """Adapter scale numerator (scale = alpha / rank)."""
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "c_attn", "c_proj")
    """Module name suffixes that get adapters (Llama and GPT-2 names)."""
    layers: int = 0
    """Adapters only in the top N transformer blocks (0 = all): backward passes then stop at the lowest adapted
    block, so training costs a forward plus N/L of a backward."""
    merged_reward_model: bool = False
    """With LoRA, save the reward model merged into a full sequence classifier (the base model's size, in its
    dtype) instead of its adapter in peft's format (~1% of that; AutoModelForSequenceClassification loads either,
    the adapter with num_labels=1). The final policy is saved merged once either way; checkpoints hold adapters."""


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning of the initial policy (`lmprefs train-sft`; the later work's supervised baseline)."""

    data: str | None = None
    """A JSONL or JSON-list file, or a save_to_disk directory (`DIR[:SPLIT]`), of rows: `prompt` and `response` (or
    TRL's `completion`) texts, or TRL's conversational `messages` (the loss on assistant turns only; the prompt and
    completion may be message lists too)."""
    epochs: int = 1
    """Passes over the pairs."""
    batch_size: int = 8
    """Pairs per optimizer step."""
    lr: float = 5e-5
    """Peak Adam learning rate (TF1-style Adam, as every lmprefs trainer); decays linearly to 0."""
    max_length: int = 0
    """Tokens per pair (prompt + response); a longer pair loses the start of its prompt, then the end of its
    response. 0 = the model's context."""


@dataclass(frozen=True)
class DPOConfig:
    """Direct preference optimization of the policy on the label store's judgments (`lmprefs train-dpo`; Rafailov
    et al. 2023): no reward model and no sampling; or online (`train-dpo --online`) on the current policy's samples
    judged by a reward. The reference is the initial policy (with LoRA, the base with its adapters off). The labels,
    their held-out share and LoRA are those of the labels and lora sections."""

    loss: Literal["pairwise", "listwise"] = "pairwise"
    """pairwise: the paper's eq. 7, -log sigmoid(h_chosen - h_other) with the implicit reward h = beta * log(pi /
    pi_ref), averaged over the pairs of a best-of-N label's chosen response and each other one. listwise:
    Plackett-Luce on h; for a best-of-N label -log softmax(h)[best], the original's best-of-N reward-model loss with
    h for the reward."""
    beta: float = 0.1
    """How far the policy may move from the reference: the implicit reward is beta * log(pi / pi_ref) (the
    paper's beta and its default)."""
    lr: float = 1e-6
    """Peak learning rate of the TF1-style Adam (as every lmprefs trainer); decays linearly to 0. The paper's 1e-6
    is for full fine-tuning; LoRA adapters want a larger one."""
    batch_size: int = 64
    """Labels per optimizer step (the paper's 64)."""
    microbatch: int | None = None
    """Labels per forward pass; their gradients add up to one batch_size step (0 = the whole batch at once). Lowers
    peak memory, not the result (the sum's order changes: equal within float rounding). None: on a CPU the most
    labels, a power of two, whose logits (fp32, the step's largest tensors) fit 512 MiB and an eighth of the
    memory free at the start (16 of the quickstart's best-of-4 labels); on a GPU the whole batch."""
    epochs: int = 1
    """Passes over the training labels."""
    online_samples: int = 2
    """train-dpo --online: responses sampled from the current policy for each query, judged by the reward (the
    highest scored is the chosen one): 2 gives the online DPO paper's pairs, more a best-of-N choice."""
    online_steps: int = 32
    """train-dpo --online: optimizer steps, each on dpo.batch_size fresh queries of the task."""


@dataclass(frozen=True)
class RunConfig:
    """Where and how a run executes."""

    seed: int = 1
    """Base seed; worker r uses seed + r * 100003 (utils/core.py:set_mpi_seed)."""
    save_dir: str | None = None
    """Run directory; None = runs/<command>-<preset>-<time>."""
    log_interval: int = 10
    """Updates between printed samples."""
    save_interval: int = 50
    """Updates between checkpoints (a checkpoint is also written at the end)."""
    device: str = "auto"
    """auto (CUDA when present, else CPU), cpu, cuda, cuda:N."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Autocast dtype for forward passes: auto = bfloat16 on CUDA with bf16 support and on CPUs with native bf16
    (AVX512-BF16, AMX), float32 elsewhere (emulated bf16 is ~3x slower than fp32)."""
    threads: int = 0
    """torch CPU threads; 0 = torch's default."""
    kv_cache: Literal["auto", "static", "dynamic"] = "auto"
    """The sampler's KV cache, both transformers': static (preallocated for query + response, fixed shapes, what
    torch.compile needs) or dynamic (grown per token); auto = static (as fast or faster, also on the CPU)."""
    compile: Literal["auto", "on", "off"] = "auto"
    """torch.compile the sampler's decode step (with CUDA graphs on a GPU), the PPO training forward, and a rollout's
    reference logprobs and reward-model scores; auto = on for CUDA (all but the decode step only without a launcher),
    off on the CPU, where a compile takes minutes and did not pay off."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """How several ranks (torchrun, accelerate launch) share the models being trained: ddp (DistributedDataParallel:
    a full copy on every rank, gradients averaged) or fsdp (FSDP2, torch.distributed.fsdp.fully_shard: each
    transformer block and the rest of the model sharded over the ranks, gathered block by block for each forward
    and backward, under run.dtype=bfloat16 gathered in bf16 with fp32 gradient reduction). fsdp is for models that do
    not fit one device; it does not combine with LoRA (lora.rank > 0) or a compiled sampler (run.compile=on).
    Ignored in one process."""
    report_to: tuple[str, ...] = ("tensorboard",)
    """Metric sinks besides metrics.jsonl: tensorboard (logs/reward, logs/policy), wandb, mlflow (each optional:
    imported only when named, never required); comma-separated, empty for none."""


@dataclass(frozen=True)
class Config:
    """One experiment: everything `train-reward`, `train-policy`, `label` and `sample` read."""

    task: TaskConfig = field(default_factory=TaskConfig)
    labels: LabelsConfig = field(default_factory=LabelsConfig)
    train_reward: TrainRewardConfig = field(default_factory=TrainRewardConfig)
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:  # validate, never mutate
        problems = validate(self)
        if problems:
            raise ValueError("; ".join(problems))
