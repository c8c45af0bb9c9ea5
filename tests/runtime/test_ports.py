"""Ports for a launch's rendezvous and store: free, distinct, and outside the kernel's ephemeral range, from which
any outgoing connection can take a port between its pick and the launch's bind (seen: a test's store failing with
EADDRINUSE on a port the test had picked with bind(0))."""

from __future__ import annotations

import socket

import pytest

from lmprefs.runtime import ports


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
        return True


def test_ports_are_distinct_free_and_below_the_ephemeral_range(tmp_path):
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("32768\t60999\n")
    picked = ports.free_ports(8, range_file)
    assert len(set(picked)) == 8
    assert all(10_000 <= p < 32_768 for p in picked), picked
    assert all(_bindable(p) for p in picked)  # released once picked, for the launch to bind


def test_a_busy_port_is_never_given(tmp_path, monkeypatch):
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("32768 60999")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        draws = iter([taken, taken, 20_001])

        class Rng:
            def randrange(self, lo, hi):
                return next(draws)

        monkeypatch.setattr(ports.random, "SystemRandom", Rng)
        if not _bindable(20_001):
            pytest.skip("port 20001 is in use on this machine")
        assert ports.free_ports(1, range_file) == [20_001]


@pytest.mark.parametrize("text", ["1024 65535", "12000 61000"])
def test_the_kernels_own_pick_where_the_range_leaves_no_room_below_it(tmp_path, text):
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text(text)
    picked = ports.free_ports(3, range_file)
    assert len(set(picked)) == 3 and all(p > 0 for p in picked)


def test_the_range_start_from_the_kernel_or_ianas_default(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("40000\t60999\n")
    bad.write_text("not a range")
    assert ports.ephemeral_start(good) == 40_000
    assert ports.ephemeral_start(bad) == ports.ephemeral_start(tmp_path / "absent") == 49_152
