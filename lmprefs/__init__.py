"""lmprefs: fine-tuning language models from human preferences, in PyTorch."""

__version__ = "0.1.0"
