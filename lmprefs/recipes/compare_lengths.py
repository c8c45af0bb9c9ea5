"""`experiment compare`'s arms at beta 0, whose only KL knob is how long they train (TRL's GRPO default, Dr. GRPO):
a kind `K-beta0` is the PPO-family kind K at rewards.kl_coef 0, one run per seed of ppo.num_updates updates (the
episode budget of every PPO-family arm), its policy evaluated after each of the `--lengths` update counts along
that run; the points give the kind's curve of true reward against KL.

One run evaluated along the way, rather than one run per length: the training costs one run's, not the sum of the
lengths', and each point is the policy that the longest run passes through (with the learning rate decaying over
the whole budget), as Gao et al. 2022 evaluate RL checkpoints along a run. A point is saved before the checkpoint at
its update, so a killed run that resumes from a checkpoint has every point up to it."""

from __future__ import annotations

from lmprefs.errors import UserError

BETA0 = "-beta0"
DEFAULT_POINTS = 4  # evaluations along a beta-0 run by default: after each quarter of it


def is_beta0(kind: str) -> bool:
    return kind.endswith(BETA0)


def default_lengths(updates: int) -> tuple[int, ...]:
    """After each quarter of a run of `updates` (fewer where the run is shorter than four updates)."""
    return tuple(sorted({max(1, round(updates * (i + 1) / DEFAULT_POINTS)) for i in range(DEFAULT_POINTS)}))


def resolve_lengths(given: tuple[int, ...], kinds: tuple[str, ...], updates: int, ppo_text: str) -> tuple[int, ...]:
    """The update counts at which a beta-0 run is evaluated: `given` (--lengths) or default_lengths, and always the
    run's end; () without a beta-0 kind. Refused in one line: --lengths without a beta-0 kind, or past the run."""
    if not any(map(is_beta0, kinds)):
        if given:
            raise UserError(f"--lengths {','.join(map(str, given))}: no arm is swept over training length; name a "
                            "beta-0 kind in --arms (e.g. grpo-beta0)")  # fmt: skip
        return ()
    past = [u for u in given if u > updates]
    if past:
        raise UserError(f"--lengths {','.join(map(str, given))}: {past[0]} is past the run's {updates} updates "
                        f"({ppo_text}), the episode budget of every PPO-family arm")  # fmt: skip
    return tuple(sorted({*given, updates})) if given else default_lengths(updates)


def check_begun(data: dict, lengths: tuple[int, ...], begun: list[str]) -> None:
    """A run directory whose beta-0 runs began with other --lengths is refused: their points before a checkpoint
    cannot be evaluated again without training again."""
    had = data.get("lengths")
    if begun and had is not None and tuple(had) != tuple(lengths):
        raise UserError(f"--lengths {','.join(map(str, lengths))}: the beta-0 runs here ({begun[0]}) were evaluated "
                        f"after {','.join(map(str, had))} updates; rerun with --lengths "
                        f"{','.join(map(str, had))}, or choose another --run-dir")  # fmt: skip
