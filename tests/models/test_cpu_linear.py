"""fp32 linear layers on the CPU through oneDNN (lmprefs.models.cpu_linear): the layer's own outputs and input
gradients within float32 rounding, the layer's own forward wherever a weight trains or autocast is on, a deepcopy
that computes with its own weights, and the choice to route: the environment's, or this machine's measurement kept
in the asset cache."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from torch import nn

from lmprefs.errors import UserError
from lmprefs.models import cpu_linear
from lmprefs.models import flops as F

pytestmark = pytest.mark.skipif(not cpu_linear.available(), reason="no oneDNN fp32 linear in this torch or CPU")


@pytest.fixture
def onednn(monkeypatch):
    """Routing on, whatever this CPU measured."""
    monkeypatch.setenv(cpu_linear.ENV, "onednn")


def layers() -> list[nn.Module]:
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    conv = Conv1D(48, 32)  # GPT-2's layout: W [in, out]
    nn.init.normal_(conv.bias)
    return [nn.Linear(32, 48), nn.Linear(32, 48, bias=False), conv]


def own(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return type(m).forward(m, x)


@pytest.mark.parametrize("i", range(3))
def test_a_frozen_layer_matches_its_own_forward_and_input_gradient(i, onednn):
    m = cpu_linear.use(layers()[i])
    assert cpu_linear.routed(m)
    m.requires_grad_(False)
    x = torch.randn(5, 7, 32, requires_grad=True)
    with F.flop_counter() as mode:
        y = m(x)
    assert mode.get_total_flops() == 2 * 35 * 32 * 48  # counted as the oneDNN op it ran
    assert any("mkldnn" in str(op) for op in mode.get_flop_counts()["Global"])
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, g)
    x2 = x.detach().requires_grad_(True)
    y2 = own(m, x2)
    (gx2,) = torch.autograd.grad(y2, x2, g)
    torch.testing.assert_close(y, y2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx, gx2, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(m(x), y2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("i", range(3))
def test_a_training_weight_autocast_and_bf16_take_the_layers_own_forward(i, onednn):
    m = cpu_linear.use(layers()[i])
    x = torch.randn(4, 32)
    with F.flop_counter() as mode:  # the weight trains: torch's own kernel, whose weight gradient autograd knows
        m(x).sum().backward()
    assert m.weight.grad is not None
    assert all("mkldnn" not in str(op) for op in mode.get_flop_counts()["Global"])
    m.requires_grad_(False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
        assert y.dtype == torch.bfloat16 and torch.equal(y, own(m, x))
    xb = x.bfloat16()
    assert torch.equal(m.bfloat16()(xb), own(m, xb))


def test_a_deepcopy_computes_with_its_own_weights(onednn):
    m = cpu_linear.use(nn.Linear(32, 48)).requires_grad_(False)
    c = copy.deepcopy(m)
    assert cpu_linear.routed(c) and c.forward.__self__ is c
    with torch.no_grad():
        c.weight.zero_()
        c.bias.fill_(1.0)
    x = torch.randn(3, 32)
    assert torch.equal(c(x), torch.ones(3, 48)) and not torch.equal(m(x), torch.ones(3, 48))


def test_loaded_models_route_their_linear_layers_where_chosen(tiny_lm):
    kinds = cpu_linear.linear_classes()
    linears = [m for m in tiny_lm[0].modules() if isinstance(m, kinds)]
    assert linears and all(cpu_linear.routed(m) == cpu_linear.chosen() for m in linears)


def test_the_choice_is_the_environments_or_this_machines_measurement_kept_in_the_cache(tmp_path, monkeypatch):
    """auto routes where the kept share is at most FASTER; a machine without an entry measures once and adds its
    own beside the others, also those written while it measured; onednn and torch decide without measuring;
    anything else is a one-line error."""
    monkeypatch.setenv("LMPREFS_CACHE", str(tmp_path))
    monkeypatch.delenv(cpu_linear.ENV, raising=False)
    cpu_linear._shares.cache_clear()
    path = tmp_path / "cpu-linear.json"

    def measure_while_another_process_adds_its_own():
        path.write_text(json.dumps({"another CPU": 0.7}))
        return 0.5

    monkeypatch.setattr(cpu_linear, "_measure", measure_while_another_process_adds_its_own)
    assert cpu_linear.chosen() and cpu_linear.onednn_share() == 0.5
    kept = json.loads(path.read_text())
    assert kept.pop("another CPU") == 0.7
    (key,) = kept
    assert f"torch {torch.__version__}" in key and f"{torch.get_num_threads()} threads" in key
    for share, routes in ((0.2, True), (0.9, False)):
        path.write_text(json.dumps({"another CPU": 0.1, key: share}))
        cpu_linear._shares.cache_clear()
        assert cpu_linear.chosen() is routes
    monkeypatch.setattr(cpu_linear, "_measure", lambda: pytest.fail("measured again"))
    assert cpu_linear.use(nn.Linear(4, 4)).forward.__func__ is nn.Linear.forward  # 0.9: not routed
    monkeypatch.setenv(cpu_linear.ENV, "onednn")
    assert cpu_linear.chosen() and cpu_linear.routed(cpu_linear.use(nn.Linear(4, 4)))
    monkeypatch.setenv(cpu_linear.ENV, "torch")
    assert not cpu_linear.chosen()
    monkeypatch.setenv(cpu_linear.ENV, "mkl")
    with pytest.raises(UserError, match="LMPREFS_CPU_LINEAR='mkl' \\(environment\\): expected auto, onednn or torch"):
        cpu_linear.chosen()
    cpu_linear._shares.cache_clear()


def test_the_measurement_times_both_kernels():
    share = cpu_linear._measure(reps=2)
    assert math.isfinite(share) and share > 0
