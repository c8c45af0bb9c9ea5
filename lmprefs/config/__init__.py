"""Configuration, the lowest layer: the frozen dataclass schema with its field docstrings (`schema`), the checks
every config passes (`validate`), the presets named after the original's experiments (`presets`), command-line and
Python overrides (`overrides`) and the comparison of two configs when a run resumes (`diff`). Imports no torch and
nothing else of lmprefs but `errors`.

The schema, the checks and the presets are re-exported here: `from lmprefs.config import Config, preset`.
"""

from lmprefs.config.presets import PRESETS, R, preset
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
from lmprefs.config.validate import LABELERS, check_label_type, label_type_shape, validate

__all__ = ["LABELERS", "PRESETS", "Config", "DPOConfig", "LabelsConfig", "LoraConfig", "PPOConfig", "R",
           "RewardsConfig", "RunConfig", "SFTConfig", "TaskConfig", "TrainRewardConfig", "check_label_type",
           "label_type_shape", "preset", "validate"]
