"""The host's connection walls of issue 45, attacked on real sockets on 127.0.0.1-9:

1. connections that proved themselves once (one ``ping``) and went idle no longer lock new boards
   out: a full table sheds the least recently active connection of an address beyond its share,
   and never a board alone on its address;
2. TLS handshakes count against the caps from accept, and one never finished is closed at the
   first-frame timeout (asyncio's server counted none of them and gave each 60 s).

Bounds are generous (BOUND_S); each test would fail on the code before issue 45 whatever the load.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from device_runtime import Bundle
from device_runtime.wire import Credentials, server_context
from device_runtime.wire.tls import client_context
from tests.conftest import TEST_SPLITS, start_host
from tests.host_runtime.test_auth import certs, with_client  # noqa: F401 (a fixture)
from tests.host_runtime.test_walls import closed_by_host, connect_from, eventually, served
from tests.host_runtime.test_walls_27 import closed

SPLIT = TEST_SPLITS[1]


@pytest.fixture(scope="module")
def bundle(mobilenet_bundle) -> Bundle:
    return Bundle.load(mobilenet_bundle)


def _fill(host, addresses: list[str]) -> list[socket.socket]:
    """One connection from each of ``addresses``, each proven by one ping, in this order."""
    socks = []
    for address in addresses:
        socks.append(connect_from(host, address))
        assert served(socks[-1])
    return socks


def test_connections_that_pinged_once_do_not_lock_a_new_board_out(mobilenet_bundle) -> None:
    """24 places, 8 each from three addresses, each connection pinged once and idle: a new board is
    served, in place of the least recently active connection of an address beyond its share (before:
    ``overloaded: 24 connections open``)."""
    for host in start_host([mobilenet_bundle], max_connections=24, max_connections_per_address=8):
        idle = _fill(host, [f"127.0.0.{2 + i % 3}" for i in range(24)])
        try:
            with connect_from(host, "127.0.0.1") as board:
                assert served(board)
                assert closed_by_host(idle[0])
                assert closed(host, "shed_beyond_share") == 1 and closed(host, "max_connections") == 0
                assert served(board) and served(idle[1])  # the rest are kept
        finally:
            for sock in idle:
                sock.close()


def test_a_board_alone_on_its_address_is_never_shed_for_another(mobilenet_bundle) -> None:
    """The least recently active connection is a board alone on its address: the flood's connection
    next in line is shed for the newcomer, and the board is still served."""
    for host in start_host([mobilenet_bundle], max_connections=24, max_connections_per_address=8):
        socks = _fill(host, ["127.0.0.1"] + [f"127.0.0.{2 + i % 3}" for i in range(23)])
        board, flood = socks[0], socks[1:]
        try:
            with connect_from(host, "127.0.0.5") as newcomer:
                assert served(newcomer)
                assert closed_by_host(flood[0])
                assert served(board)
        finally:
            for sock in socks:
                sock.close()


def test_tls_handshakes_count_against_the_caps(mobilenet_bundle, bundle, certs) -> None:  # noqa: F811
    """Eight TCP connections to a TLS host that never start their handshake fill its eight places (the
    gauge counts them; it stayed at 0); a board's TLS connection is served in place of the oldest."""
    for host in start_host([mobilenet_bundle], tls=server_context(*certs["host"]), max_connections=8,
                           first_frame_timeout=600.0):
        silent = [connect_from(host, f"127.0.0.{2 + i % 4}") for i in range(8)]
        try:
            assert eventually(host, lambda: host.server.gate.total, lambda n: n == 8) == 8
            assert host.server.stats.as_dict()["connections"] == 8
            credentials = Credentials(tls=client_context(certs["host"][0]))
            assert asyncio.run(with_client(host, lambda c: c.ping(), credentials)) >= 0
            assert closed_by_host(silent[0])
            assert closed(host, "shed") == 1 and closed(host, "max_connections") == 0
        finally:
            for sock in silent:
                sock.close()


def test_a_tls_handshake_never_finished_ends_at_the_first_frame_timeout(mobilenet_bundle, certs) -> None:  # noqa: F811
    """A connection that never finishes its handshake is closed at --first-frame-timeout (asyncio's
    own bound was 60 s), counted as ``tls_handshake``, its place freed."""
    for host in start_host([mobilenet_bundle], tls=server_context(*certs["host"]), first_frame_timeout=0.5):
        with connect_from(host, "127.0.0.2") as silent, connect_from(host, "127.0.0.3") as partial:
            partial.sendall(b"\x16\x03\x01\x02\x00")  # a ClientHello's record header, and nothing after
            assert closed_by_host(silent) and closed_by_host(partial)
        assert eventually(host, lambda: closed(host, "tls_handshake"), lambda n: n == 2) == 2  # counted after the close
        assert eventually(host, lambda: host.server.gate.total, lambda n: n == 0) == 0
