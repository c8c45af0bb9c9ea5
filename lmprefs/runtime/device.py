"""Device and dtype: where a run computes and in which precision its forward passes autocast."""

from __future__ import annotations

import contextlib
import functools
import os
import re
from pathlib import Path

import torch

from lmprefs.config.validate import DEVICES
from lmprefs.errors import UserError
from lmprefs.runtime.distributed import active, device_for
from lmprefs.runtime.memory import keep_freed_memory


def pick_device(name: str = "auto", what: str = "device") -> torch.device:
    """The torch device `name` names (auto: CUDA when present); a name torch does not know ('tpu') or CUDA where
    there is none is a UserError naming `what` gave it (e.g. "--device")."""
    if not DEVICES.fullmatch(name):
        raise UserError(f"{what} {name!r}: choose auto, cpu, cuda, cuda:N or mps")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"{what} {name!r}: CUDA is not available here (torch {torch.__version__}); use cpu or auto")
    return torch.device(name)


@functools.cache
def cpu_info() -> tuple[str, frozenset[str]]:
    """This CPU's model name and feature flags from /proc/cpuinfo (its first processor); ("", no flags) where there
    is none."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "", frozenset()
    name = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    return (name.group(1).strip() if name else ""), frozenset(flags.group(1).split() if flags else ())


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX). Without it bf16 is emulated and slower
    than fp32; with it bf16 autocast makes PPO faster (both measured in docs/results.md)."""
    return not cpu_info()[1].isdisjoint({"avx512_bf16", "amx_bf16"})


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """The autocast dtype: auto = bf16 where it is fast (CUDA with bf16, a CPU with native bf16), float32 elsewhere,
    unless LMPREFS_AUTO_DTYPE names what auto means (the test suite runs once in each, whatever the CPU)."""
    if name == "auto" and os.environ.get("LMPREFS_AUTO_DTYPE"):
        name = os.environ["LMPREFS_AUTO_DTYPE"]
        if name not in ("float32", "bfloat16"):
            raise UserError(f"LMPREFS_AUTO_DTYPE={name!r} (environment): expected float32 or bfloat16")
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        if device.type == "cpu" and cpu_has_native_bf16():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision for forward passes; a no-op for float32. Parameters and optimizer state stay fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def setup_torch(run) -> tuple[torch.device, torch.dtype]:
    """Device, autocast dtype and threads from RunConfig; on the CPU, freed tensor memory kept for reuse
    (`keep_freed_memory`)."""

    if run.threads:
        torch.set_num_threads(run.threads)
    device = device_for(pick_device(run.device, "run.device"))  # cuda:LOCAL_RANK under a launcher
    if device.type == "cpu":
        keep_freed_memory()
    return device, pick_dtype(run.dtype, device)


def compiles_forwards(compile: str, device: torch.device) -> bool:
    """Whether run.compile compiles the model forwards of a PPO update: the training forward, the reference's
    logprobs and the reward model's scores. on = always, off = never, auto = on CUDA without a launcher (under
    DDP/FSDP, even at world size 1, compiled forwards have not been measured yet)."""
    return compile == "on" or (compile == "auto" and device.type == "cuda" and not active())
