"""Ports for test servers come from below the ephemeral range, a slice per xdist worker.

A port the kernel picked with ``bind(0)`` can be taken as some outgoing connection's source
port before the server binds it; CI once lost a closed-loop run to exactly that.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from warden.common import ports
from warden.common.ports import (
    FIRST_PORT,
    SLICE_PORTS,
    ephemeral_range,
    free_port,
    port_slice,
    slice_index,
)


def test_ports_handed_out_are_below_the_ephemeral_range_and_never_repeat() -> None:
    low, _ = ephemeral_range()
    handed = [free_port() for _ in range(50)]
    assert len(set(handed)) == len(handed)
    assert all(FIRST_PORT <= port < low for port in handed)


def test_a_port_someone_is_bound_to_is_skipped() -> None:
    first = free_port()
    ports._cursor = None  # the next walk starts at the same place again
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first))
        holder.listen()
        assert free_port() != first
    ports._cursor = None


def test_each_xdist_worker_scans_its_own_slice() -> None:
    slices = [port_slice(32768, environ={"PYTEST_XDIST_WORKER": f"gw{n}"}) for n in range(4)]
    assert all(s is not None and len(s) == SLICE_PORTS for s in slices)
    taken = [set(s) for s in slices if s is not None]
    assert all(a.isdisjoint(b) for i, a in enumerate(taken) for b in taken[i + 1 :])
    assert max(s.stop for s in slices if s is not None) <= 32768


def test_outside_xdist_the_slice_comes_from_the_pid() -> None:
    assert slice_index(12, environ={}, pid=25) == 1
    assert slice_index(12, environ={"PYTEST_XDIST_WORKER": "gw3"}, pid=25) == 3


def test_an_ephemeral_range_that_leaves_no_room_falls_back_to_the_kernels_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert port_slice(FIRST_PORT + SLICE_PORTS - 1) is None
    narrow = tmp_path / "range"
    narrow.write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "ephemeral_range", lambda: ephemeral_range(narrow))
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_an_unreadable_range_file_means_linuxs_default(tmp_path: Path) -> None:
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)
