"""LoRA adapters (Hu et al. 2021) on one frozen base: the policy, the value function and the reward model are named
adapters on the same weights, and the reference policy is the base with adapters off, so one copy of the model
serves all four roles. Written here (about 100 lines) rather than taken from peft to keep several named adapters
on one module switchable by a context manager (policy, value, reward; the reference is the base with none active),
and GPT-2's Conv1D handled alongside nn.Linear. peft's layers were not faster on the same top-block forward +
backward (benchmarks/lora_vs_peft.py; three noisy runs on a shared 2-core CPU, docs/results.md). Saved adapters use
peft's format (save_peft_adapter), so PeftModel.from_pretrained loads them.
"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import TypeVar, cast

import torch
from torch import Tensor, nn

from lmprefs.config import LoraConfig
from lmprefs.errors import UserError
from lmprefs.models.loading import base_of, trunk_blocks

_M = TypeVar("_M", bound=nn.Module)


class LoRALinear(nn.Module):
    """base(x) + scale * x A^T B^T for the active adapter; B starts at 0 so an adapter starts as the identity."""

    def __init__(self, base: nn.Module, rank: int, alpha: float):
        super().__init__()
        self.base, self.rank, self.scale = base, rank, alpha / rank
        self.transposed = type(base).__name__ == "Conv1D"  # GPT-2 stores [in, out]
        w = cast(Tensor, base.weight)  # an nn.Linear's or a Conv1D's
        self.in_features, self.out_features = (w.shape[0], w.shape[1]) if self.transposed else (w.shape[1], w.shape[0])
        self.A = nn.ParameterDict()
        self.B = nn.ParameterDict()
        self.active: str | None = None

    def add(self, name: str, generator: torch.Generator | None = None) -> None:
        a = torch.empty(self.rank, self.in_features, device=cast(Tensor, self.base.weight).device)
        bound = 1 / math.sqrt(self.in_features)  # nn.Linear's default init (kaiming uniform, a=sqrt(5))
        a.uniform_(-bound, bound, generator=generator)
        self.A[name] = nn.Parameter(a)
        self.B[name] = nn.Parameter(torch.zeros(self.out_features, self.rank, device=a.device))

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)
        if self.active is None:
            return y
        a, b = self.A[self.active], self.B[self.active]
        if not torch.is_autocast_enabled(x.device.type):  # under autocast the matmul casts x itself, once
            x = x.to(a.dtype)
        return y + (x @ a.t() @ b.t()).to(y.dtype) * self.scale

    def merged_weight(self, name: str) -> Tensor:
        delta = (self.B[name] @ self.A[name]) * self.scale  # [out, in]
        return self.base.weight + (delta.t() if self.transposed else delta)


def lora_modules(model: nn.Module) -> list[LoRALinear]:
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def adapted_layers(model: nn.Module, cfg: LoraConfig) -> list[tuple[str, nn.Module]]:
    """The (name, layer) pairs add_adapter(model, cfg) wraps, or a UserError naming lora.targets (none match) or
    lora.rank (wider than a layer): checked where the model loads, before a command writes anything."""
    allowed = _top_block_modules(model, cfg.layers)
    targets = [(n, m) for n, m in model.named_modules()
               if n.split(".")[-1] in cfg.targets and type(m).__name__ in ("Linear", "Conv1D")
               and (allowed is None or id(m) in allowed)]  # fmt: skip
    if not targets:
        raise UserError(f"lora.targets={','.join(cfg.targets)} match no Linear layer of {type(model).__name__}")
    width = min(min(m.weight.shape) for _, m in targets)
    if cfg.rank > width:  # a rank past the layers' width adds nothing but memory (and can exhaust it)
        raise UserError(f"lora.rank={cfg.rank} exceeds the width of the layers it adapts ({width}); a rank is "
                        "a few to a few dozen")  # fmt: skip
    return targets


def add_adapter(model: nn.Module, cfg: LoraConfig, name: str, seed: int = 0) -> list[nn.Parameter]:
    """Wrap the target layers once (freezing the base), then add adapter `name`; returns its parameters."""
    if not lora_modules(model):
        model.requires_grad_(False)
        for n, m in adapted_layers(model, cfg):
            parent = model.get_submodule(n.rsplit(".", 1)[0]) if "." in n else model
            setattr(parent, n.split(".")[-1], LoRALinear(m, cfg.rank, cfg.alpha))
    g = torch.Generator().manual_seed(seed)
    params = []
    for m in lora_modules(model):
        if name not in m.A:
            m.add(name, g)
        params += [m.A[name], m.B[name]]
    return params


def reset_adapter(model: nn.Module, name: str, seed: int = 0) -> None:
    """Re-initialize adapter `name` in place (B = 0 again: the adapter is the identity)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora_modules(model):
            bound = 1 / math.sqrt(m.in_features)
            m.A[name].uniform_(-bound, bound, generator=g)
            m.B[name].zero_()


def adapter_start(model: nn.Module, cfg: LoraConfig) -> int:
    """The lowest block that add_adapter(model, cfg) gives adapters: the frozen depth (`trunk.frozen_depth`) the model
    will have, 0 without LoRA or with adapters in every block."""
    n = len(trunk_blocks(model))
    return n - cfg.layers if cfg.rank > 0 and 0 < cfg.layers < n else 0


def _top_block_modules(model: nn.Module, top: int) -> set[int] | None:
    """ids of the modules inside the top `top` transformer blocks, or None (no restriction) when top <= 0."""

    if top <= 0:
        return None
    blocks = trunk_blocks(model)
    return {id(m) for block in blocks[max(0, len(blocks) - top) :] for m in block.modules()}


@contextlib.contextmanager
def using(model: nn.Module, name: str | None):
    """Run with adapter `name` active (None: the bare base, i.e. the reference policy); restores the previous one."""
    mods = lora_modules(model)
    before = [m.active for m in mods]
    for m in mods:
        m.active = name
    try:
        yield
    finally:
        for m, b in zip(mods, before, strict=True):
            m.active = b


def merged_copy(model: _M, name: str | None) -> _M:
    """A plain copy of the model with adapter `name` merged into its weights (a standard HF model to save)."""
    out = copy.deepcopy(model)
    for n, m in list(out.named_modules()):
        if isinstance(m, LoRALinear):
            base = m.base
            if name is not None:
                with torch.no_grad():
                    cast(Tensor, base.weight).copy_(m.merged_weight(name))
            parent = out.get_submodule(n.rsplit(".", 1)[0]) if "." in n else out
            setattr(parent, n.split(".")[-1], base)
    return out


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items() if ".A." in k or ".B." in k}


def save_peft_adapter(model: nn.Module, name: str, out, task_type: str = "CAUSAL_LM",
                      extra: dict[str, Tensor] | None = None) -> None:  # fmt: skip
    """Adapter `name` in peft's format (adapter_config.json + adapter_model.safetensors), so that
    PeftModel.from_pretrained(initial_model, out) rebuilds it: same modules, rank, alpha (scale alpha / rank),
    GPT-2's Conv1D as fan_in_fan_out. `extra`: whole modules' tensors saved beside the adapter as peft's
    modules_to_save ({"score.weight": ...} for a sequence classifier's head); task_type "SEQ_CLS" for those.
    The adapters are written in fp32, as trained (they are ~1% of the model). base_model_name_or_path is the name
    the run loaded the model by, never an absolute path (loading.portable_base: an asset or hub name, or a local
    directory's own name, whose path the saved lmprefs.json keeps)."""
    from pathlib import Path

    from peft import LoraConfig as PeftLoraConfig
    from safetensors.torch import save_file

    out = Path(out)
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    first = mods[0][1]
    base = base_of(model)[0]
    whole = sorted({k.rsplit(".", 1)[0] for k in extra or {}})  # modules saved whole: "score", "transformer.ln_f"
    # peft annotates lora_alpha as int but takes any number (its scale is alpha / r); lora.alpha is a float
    PeftLoraConfig(r=first.rank, lora_alpha=first.rank * first.scale,  # type: ignore[arg-type]
                   target_modules=[n for n, _ in mods], lora_dropout=0.0, bias="none",
                   fan_in_fan_out=first.transposed, task_type=task_type,
                   modules_to_save=whole or None, base_model_name_or_path=str(base),
                   inference_mode=True).save_pretrained(str(out))  # fmt: skip
    tensors = {f"base_model.model.{k}": v.detach().float().cpu().contiguous() for k, v in (extra or {}).items()}
    for n, m in mods:
        tensors[f"base_model.model.{n}.lora_A.weight"] = m.A[name].detach().float().cpu().contiguous()  # [r, in]
        tensors[f"base_model.model.{n}.lora_B.weight"] = m.B[name].detach().float().cpu().contiguous()  # [out, r]
    save_file(tensors, str(out / "adapter_model.safetensors"))


def load_peft_adapter(model: nn.Module, name: str, adapter_dir) -> dict[str, Tensor]:
    """Adapter `name` on `model` from a directory in peft's format (save_peft_adapter's): the layers it names are
    wrapped as LoRALinear where they are not yet (the base frozen), its A and B copied in. Returns the saved tensors
    that are not LoRA weights (peft's modules_to_save: a sequence classifier's head), by module path. A UserError
    when the directory's rank, scale or layers differ from the adapters already on `model`."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    d = Path(adapter_dir)
    conf = json.loads((d / "adapter_config.json").read_text())
    rank, alpha = int(conf["r"]), float(conf["lora_alpha"])
    tensors = {k.removeprefix("base_model.model."): v for k, v in load_file(d / "adapter_model.safetensors").items()}
    names = sorted({k.rsplit(".lora_", 1)[0] for k in tensors if ".lora_" in k})
    if not lora_modules(model):
        model.requires_grad_(False)
    for n in names:
        m = model.get_submodule(n)
        if not isinstance(m, LoRALinear):
            parent = model.get_submodule(n.rsplit(".", 1)[0]) if "." in n else model
            m = LoRALinear(m, rank, alpha)
            setattr(parent, n.split(".")[-1], m)
        if m.rank != rank or not math.isclose(m.scale, alpha / rank):
            raise UserError(f"{d}: adapter rank {rank}, alpha {alpha} differ from the adapters already loaded")
        a, b = tensors[f"{n}.lora_A.weight"], tensors[f"{n}.lora_B.weight"]  # [r, in], [out, r]
        dev = cast(Tensor, m.base.weight).device
        m.A[name] = nn.Parameter(a.float().to(dev), requires_grad=False)
        m.B[name] = nn.Parameter(b.float().to(dev), requires_grad=False)
    if {id(m) for m in lora_modules(model)} != {id(model.get_submodule(n)) for n in names}:
        raise UserError(f"{d}: adapts other layers than the adapters already loaded")
    return {k: v for k, v in tensors.items() if ".lora_" not in k}
