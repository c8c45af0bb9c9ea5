"""What the label-file readers and writers share: the format names, GPT-2's vocabulary size and pad id ("openai"
files hold GPT-2 token ids), the sample fields of each label type in those files, and the error a bad file raises."""

from __future__ import annotations

from lmprefs.config import label_type_shape

FORMATS = ("openai", "pairs", "comparisons")  # import and export
IMPORT_FORMATS = (*FORMATS, "summarize", "scores")
GPT2_VOCAB = 50257
GPT2_PAD = 50259  # "for historical reasons" (language/encodings.py @cbfd210)


class LabelFileError(ValueError):
    """A label file that cannot be imported; the message names the file, row or line, and field."""


def sample_keys(label_type: str) -> list[str]:
    """The fields an "openai" row of `label_type` holds its samples in."""
    n = label_type_shape(label_type)[1]
    return ["sample"] if label_type == "scalar_rating" else [f"sample{i}" for i in range(n)]
