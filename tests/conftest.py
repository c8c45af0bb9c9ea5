"""Shared fixtures: the tiny random GPT-2 (built once into the asset cache), and a guard that fails any test that
opens a non-loopback connection: no test may touch the network."""

from __future__ import annotations

import os
import socket

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
# Tests run tiny models: with two OpenMP threads their small matmuls spend more time synchronising than computing,
# and under load from other processes 10x more. Subprocesses inherit this too.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The multi-process launches (torchrun, accelerate) look this machine's hostname up several times; where it resolves
# to no address and no DNS server answers, each lookup waits for glibc's resolver timeout (a 2-rank tiny run took 83 s
# instead of 7). Every address the tests use is the loopback, so a second per lookup is plenty.
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")

_connect = socket.socket.connect


def _guarded_connect(self, address):
    host = address[0] if isinstance(address, tuple) else address
    local = isinstance(host, str) and (host.startswith("127.") or host in ("localhost", "::1"))
    if isinstance(host, str) and not (local or self.family == socket.AF_UNIX):
        raise RuntimeError(f"test tried to reach the network: {address!r}")
    return _connect(self, address)


socket.socket.connect = _guarded_connect


@pytest.fixture(scope="session")
def tiny_lm():
    """(model, tokenizer): a 2-layer, 32-dim random GPT-2 with the real GPT-2 tokenizer, shared by every test of a
    process: a test that changes the model (freezes it, adds an adapter) works on a copy."""
    import torch

    from lmprefs.models.loading import load_lm

    torch.manual_seed(0)
    return load_lm("tiny-gpt2")


def _state(model) -> tuple:
    """What a test could change in the shared model: its modules' own forwards, training mode, which parameters
    train, and their values (a checksum)."""
    import torch

    with torch.no_grad():
        params = tuple((n, p.requires_grad, p.dtype, float(p.double().sum())) for n, p in model.named_parameters())
    return params, tuple((type(m).__name__, m.training, "forward" in m.__dict__) for m in model.modules())


@pytest.fixture(autouse=True)
def _tiny_lm_left_as_found(request):
    """Fails a test that changed the shared tiny_lm: in one process every later test would see it changed."""
    if "tiny_lm" not in request.fixturenames:
        yield
        return
    model = request.getfixturevalue("tiny_lm")[0]
    before = _state(model)
    yield
    assert _state(model) == before, "the test changed the shared tiny_lm model: work on copy.deepcopy(tiny_lm[0])"


def pytest_report_header(config):
    """Which dtype run.dtype=auto means in this run: CI runs the suite once in each."""
    import torch

    from lmprefs.runtime.device import pick_dtype

    return f"lmprefs: run.dtype=auto is {pick_dtype('auto', torch.device('cpu'))} on this CPU"
