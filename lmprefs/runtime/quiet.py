"""transformers kept quiet: its progress bars ("Loading weights", "Writing model shards") and its warnings would
come before a command's own output (a score, a sample) and drown its progress; lmprefs says what it is doing itself."""

from __future__ import annotations


def quiet_transformers() -> None:
    """Switch off transformers' progress bars and its messages below errors, for this process."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
