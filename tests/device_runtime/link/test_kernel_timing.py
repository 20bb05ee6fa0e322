"""The kernel's view of the host link: struct tcp_info parsed by length, receive stamps, upload looks."""

from __future__ import annotations

import socket
import struct
import sys
import time

import pytest

from device_runtime.link import UploadTiming, kernel_timing_support
from device_runtime.link._kernel_timing import (
    POLL_FIRST_S, POLL_GROWTH, TcpInfo, UploadWatch, arrival_lag_s, enable_rx_timestamps, parse_tcp_info,
    read_tcp_info,
)
from tests.calibration.test_timing import ManualClock

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO and SO_TIMESTAMPNS are Linux's")

#: sizeof(struct tcp_info) in Linux 5.4 (up to tcpi_snd_wnd); newer kernels append fields.
FULL = 232


def _raw(length: int = FULL, **fields: int) -> bytes:
    """A struct tcp_info of ``length`` bytes with ``fields`` at their offsets (uapi/linux/tcp.h)."""
    raw = bytearray(max(length, 232))
    offsets = {"state": (0, "B"), "snd_mss": (16, "I"), "unacked": (24, "I"), "last_data_recv_ms": (52, "I"),
               "rtt_us": (68, "I"), "rttvar_us": (72, "I"), "bytes_acked": (120, "Q"), "notsent_bytes": (144, "I"),
               "min_rtt_us": (148, "I"), "delivery_rate": (160, "Q"), "rwnd_limited_us": (176, "Q"), "delivered": (192, "I")}
    for name, value in fields.items():
        offset, fmt = offsets[name]
        struct.pack_into("=" + fmt, raw, offset, value)
    return bytes(raw[:length])


def test_fields_are_read_at_their_offsets() -> None:
    raw = bytearray(_raw(state=1, snd_mss=1448, unacked=7, rtt_us=850, rttvar_us=120, bytes_acked=10**10,
                         notsent_bytes=4096, min_rtt_us=310, delivery_rate=62_500_000, delivered=99))
    raw[7] |= 1  # tcpi_delivery_rate_app_limited, the lowest bit of the eighth byte
    info = parse_tcp_info(bytes(raw))
    assert info == TcpInfo(state=1, snd_mss=1448, unacked=7, last_data_recv_ms=0, rtt_us=850, rttvar_us=120,
                           bytes_acked=10**10, notsent_bytes=4096, min_rtt_us=310, delivery_rate=62_500_000,
                           delivered=99, app_limited=True, rwnd_limited_us=0)
    assert info.delivery_rate_bps == 500e6


@pytest.mark.parametrize(("length", "present", "absent"), [
    (104, "rtt_us", "bytes_acked"),  # Linux < 4.1: up to tcpi_total_retrans
    (144, "bytes_acked", "notsent_bytes"),  # < 4.6
    (160, "min_rtt_us", "delivery_rate"),  # < 4.9
    (192, "delivery_rate", "delivered"),  # < 4.18
    (280, "delivered", None),  # a newer kernel's longer struct: the rest is not read
])
def test_an_older_kernels_shorter_struct_leaves_its_missing_fields_none(length: int, present: str, absent: str | None) -> None:
    info = parse_tcp_info(_raw(length, state=1, rtt_us=5, bytes_acked=3, min_rtt_us=2, delivery_rate=9, delivered=4))
    assert getattr(info, present) is not None
    if absent is not None:
        assert getattr(info, absent) is None
    assert (info.app_limited is None) == (info.delivery_rate is None)


def test_a_struct_shorter_than_its_first_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="3 bytes"):
        parse_tcp_info(b"\x01\x00\x00")
    assert read_tcp_info(None) is None


@linux_only
def test_a_real_connection_on_loopback_reads_sensibly() -> None:
    """What the kernel reports of a connection that carried 200 KB, each field where it should be."""
    with _pair() as (client, server):
        before = read_tcp_info(client)
        client.sendall(b"x" * 200_000)
        got = 0
        while got < 200_000:
            got += len(server.recv(1 << 20))
        info = read_tcp_info(client)
        for _ in range(200):  # the last ACK is the receiving kernel's, at once on loopback
            if info.bytes_acked - before.bytes_acked >= 200_000:
                break
            time.sleep(0.005)
            info = read_tcp_info(client)
    assert before is not None and info is not None
    assert info.state == 1  # TCP_ESTABLISHED
    assert info.bytes_acked - before.bytes_acked == 200_000
    assert info.snd_mss > 0 and info.unacked == 0 and info.notsent_bytes == 0
    assert 0 < info.min_rtt_us <= info.rtt_us < 1_000_000  # µs, and the minimum is not above the smoothed one
    assert info.delivery_rate_bps is not None


@linux_only
def test_a_receive_stamp_tells_how_long_bytes_waited_for_the_reader() -> None:
    """The stamp is the kernel's, taken as the bytes arrived; the lag is now (here a clock the
    test sets 30 s on) less it. Peeking consumes nothing."""
    with _pair() as (client, server):
        assert enable_rx_timestamps(client)
        assert arrival_lag_s(client) is None  # nothing waiting
        before = time.time()
        server.sendall(b"hello")
        client.settimeout(5.0)
        client.recv(1, socket.MSG_PEEK)  # wait for it to be there
        client.settimeout(0.0)
        after = time.time()
        lag = arrival_lag_s(client, clock=lambda: after + 30.0)
        assert lag is not None and 30.0 <= lag <= 30.0 + (after - before)
        assert arrival_lag_s(client, clock=lambda: before - 1.0) is None  # a clock step back: no lag
        client.settimeout(5.0)
        assert client.recv(5) == b"hello"  # peeking left it all there


@linux_only
def test_this_machines_kernel_gives_all_three() -> None:
    support = kernel_timing_support()
    assert (support.tcp_info, support.ack_stamps, support.rx_timestamps) == (True, True, True), support.reason
    assert support.describe() == "the kernel's: TCP_INFO, ACK stamps, reply stamps"


def test_without_the_kernels_timings_info_says_the_device_times_itself() -> None:
    from device_runtime.link import KernelTimingSupport

    none = KernelTimingSupport(False, False, False, "no TCP_INFO; no ACK stamps (SO_TIMESTAMPING) on TCP")
    assert none.describe() == "the device's own timing (no TCP_INFO; no ACK stamps (SO_TIMESTAMPING) on TCP)"
    part = KernelTimingSupport(True, False, True, "no ACK stamps (SO_TIMESTAMPING) on TCP")
    assert part.describe().startswith("the kernel's: TCP_INFO, reply stamps; no ACK stamps")


@linux_only
def test_ack_stamps_are_keyed_by_each_writes_last_byte() -> None:
    """Two writes on loopback (a reader drains them): one stamp each, at the offset of its last byte."""
    from device_runtime.link._kernel_timing import KernelTiming

    with _pair() as (client, server):
        kernel = KernelTiming(client)
        try:
            assert kernel.ack_stamps
            before = time.time()
            client.sendall(b"a" * 1000)
            client.sendall(b"b" * 30_000)
            got = 0
            while got < 31_000:
                got += len(server.recv(1 << 16))
            stamps: list[tuple[int, float]] = []
            for _ in range(400):
                stamps += kernel.acks()
                if len(stamps) >= 2:
                    break
                time.sleep(0.005)
        finally:
            kernel.close()
    assert [key for key, _ in stamps] == [999, 30_999]
    assert all(before <= stamp <= time.time() for _, stamp in stamps)


class _Kernel:
    """TCP_INFO as a test wants it: bytes acknowledged so far, one MSS of 1448."""

    def __init__(self) -> None:
        self.acked = 0
        self.calls = 0

    def __call__(self) -> TcpInfo:
        self.calls += 1
        return TcpInfo(state=1, snd_mss=1448, bytes_acked=self.acked, min_rtt_us=400)


def test_looks_give_the_rate_the_link_acknowledged_bytes_at_however_late_they_come() -> None:
    """600 KB at 50 Mbit/s: the looks come late (a busy board) but each reads the kernel's count
    as it is then, so the rate between two of them is the link's."""
    clock, kernel = ManualClock(), _Kernel()
    watch = UploadWatch(kernel, clock)
    start = clock()
    assert watch.sent(1, start, 600_000)  # crossing: a look is due
    rate_Bps = 50e6 / 8
    delay = None
    for late in (0.004, 0.011, 0.0005, 0.020):  # the board's lateness at each look
        clock.now += (delay or POLL_FIRST_S) + late
        kernel.acked = int(rate_Bps * (clock() - start))
        delay = watch.look()
        assert delay == pytest.approx(max(POLL_FIRST_S, POLL_GROWTH * (clock() - start)))
    clock.now += 0.100
    kernel.acked = 600_000 - 1000  # all but the last segment, whose ACK may ride on the reply
    assert watch.look() is None  # nothing crossing: no more looks
    done_at = clock() - start
    timing = watch.settled(1)
    assert timing.acked_bps == pytest.approx(50e6, rel=1e-3)
    assert timing.done_s == pytest.approx(done_at) and timing.min_rtt_s == pytest.approx(400e-6)
    assert timing.span_s > 0.03
    assert watch.settled(1) is None  # once


def test_an_upload_across_within_its_write_is_done_at_the_first_look() -> None:
    """Loopback carries the bytes inside the write: the look right after it finds them acknowledged."""
    clock, kernel = ManualClock(), _Kernel()
    watch = UploadWatch(kernel, clock)
    kernel.acked = 602_112
    clock.now += 0.0003
    assert not watch.sent(7, clock() - 0.0003, 602_112)  # nothing due
    timing = watch.settled(7)
    assert timing.done_s == pytest.approx(0.0003) and timing.acked_bps is None


def test_a_look_while_an_earlier_request_crosses_counts_for_both() -> None:
    """Two requests in one stream: the second is done only when the kernel has acknowledged up to its end."""
    clock, kernel = ManualClock(), _Kernel()
    watch = UploadWatch(kernel, clock)
    watch.sent(1, clock(), 100_000)
    watch.sent(2, clock(), 200_000)
    clock.now += 0.010
    kernel.acked = 150_000
    assert watch.look() is not None
    assert watch.settled(1).done_s == pytest.approx(0.010)
    clock.now += 0.010
    kernel.acked = 200_000
    assert watch.look() is None
    assert watch.settled(2).done_s == pytest.approx(0.020)


def test_without_tcp_info_nothing_is_looked_at() -> None:
    watch = UploadWatch(lambda: None, ManualClock())
    assert not watch.sent(1, 0.0, 1000)
    assert watch.settled(1) == UploadTiming()  # nothing seen: the device's own timing alone
    assert UploadWatch(lambda: TcpInfo(state=1), ManualClock()).look() is None  # no tcpi_bytes_acked (Linux < 4.1)


class _pair:
    """A connected TCP pair on 127.0.0.1."""

    def __enter__(self) -> tuple[socket.socket, socket.socket]:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.client = socket.create_connection(self.listener.getsockname(), timeout=5.0)
        self.server, _ = self.listener.accept()
        return self.client, self.server

    def __exit__(self, *exc: object) -> None:
        for sock in (self.client, self.server, self.listener):
            sock.close()


class _StandIn:
    """The kernel as a test decides: each reply reaches the board ``flight_s`` after it is sent
    (on the test's clock) and then waits ``wait_s`` for the board's CPU before it is read."""

    def __init__(self, clock: ManualClock, flight_s: float, wait_s: float) -> None:
        self.clock, self.flight_s, self.wait_s = clock, flight_s, wait_s
        self.stamps = True
        self.arrived = False

    def reply_lag_s(self) -> float:
        if not self.arrived:  # once: the loop may wake for the socket's error queue as well
            self.arrived = True
            self.clock.now += self.flight_s + self.wait_s
        return self.wait_s

    def tcp_info(self) -> TcpInfo:
        return TcpInfo(state=1, snd_mss=1448, bytes_acked=10**12, min_rtt_us=100)  # everything acknowledged

    def acks(self) -> list[tuple[int, float]]:
        return []

    def close(self) -> None:
        pass


def test_a_reply_that_waited_for_the_board_is_timed_at_its_arrival(host) -> None:
    """A reply 30 ms out, then 250 ms in the kernel while the board's CPU was elsewhere: the
    round trip is the 30 ms, the wait is told apart, and the upload was seen acknowledged."""
    import asyncio

    from device_runtime.link import HostClient

    async def go():
        client = await HostClient.connect(host.host, host.port)
        try:
            clock = ManualClock()
            protocol = client._protocol
            protocol.clock = clock
            protocol.kernel = _StandIn(clock, flight_s=0.030, wait_s=0.250)
            protocol.watch = UploadWatch(protocol.kernel.tcp_info, clock)
            return await client.probe(65_536)
        finally:
            await client.close()

    probe = asyncio.run(go())
    assert probe.round_trip_ms == pytest.approx(30.0) and probe.reply_wait_ms == pytest.approx(250.0)
    assert probe.upload is not None and probe.upload.done_s == 0.0 and probe.upload.min_rtt_s == pytest.approx(1e-4)


def test_a_client_without_kernel_timing_looks_at_nothing_and_times_by_its_own_clock(host) -> None:
    """``kernel_timing=False`` (a load generator's boards): no duplicate socket for the stamps, no
    ``TCP_INFO`` looks, no upload timing; the probe still answers, timed by the client's clock.
    The default, on this Linux, has all three."""
    import asyncio

    from device_runtime.link import HostClient

    async def go(kernel_timing: bool):
        client = await HostClient.connect(host.host, host.port, kernel_timing=kernel_timing)
        try:
            protocol = client._protocol
            return protocol.kernel, protocol.watch, await client.probe(65_536)
        finally:
            await client.close()

    kernel, watch, probe = asyncio.run(go(False))
    assert kernel is None and watch is None
    assert probe.upload is None and probe.reply_wait_ms == 0.0 and probe.round_trip_ms > 0.0
    kernel, watch, probe = asyncio.run(go(True))
    assert kernel is not None and kernel.stamps and watch is not None and probe.upload is not None


def test_an_upload_crossing_slowly_shows_its_rate_before_it_is_done() -> None:
    """602 KB after the link dropped to 5 Mbit/s: a second to cross; looks no more than 50 ms
    apart, and the last 200 ms of them give the rate it crosses at now."""
    from device_runtime.link._kernel_timing import POLL_MAX_S

    clock, kernel = ManualClock(), _Kernel()
    watch = UploadWatch(kernel, clock)
    start = clock()
    watch.sent(1, start, 602_112)
    assert watch.crossing() is None  # one look
    delay = POLL_FIRST_S
    while clock() - start < 0.3:
        clock.now += delay
        kernel.acked = int(5e6 / 8 * (clock() - start))
        delay = watch.look()
        assert delay <= POLL_MAX_S
    rate, span = watch.crossing()
    assert rate == pytest.approx(5e6, rel=0.01) and 0.15 <= span <= 0.2


def test_the_meter_is_capped_by_an_upload_crossing_slower_than_it_says() -> None:
    from device_runtime.hosts._link_meter import CROSSING_MIN_S, LinkMeter
    from calibration import RateEstimator

    meter = LinkMeter(RateEstimator(initial_bps=50e6))
    meter.crossing = lambda: (5e6, CROSSING_MIN_S)
    assert meter.rate_bps == 5e6
    meter.crossing = lambda: (5e6, CROSSING_MIN_S / 2)  # watched too briefly to say
    assert meter.rate_bps == pytest.approx(50e6)
    meter.crossing = lambda: (80e6, 0.1)  # faster than the estimate: the finished upload will say so
    assert meter.rate_bps == pytest.approx(50e6)
    meter.crossing = lambda: None
    assert meter.rate_bps == pytest.approx(50e6)


def test_an_upload_the_hosts_window_holds_back_shows_no_crossing_rate() -> None:
    """The host not reading (its receive window shut) paces the ACKs: that is no rate of the link."""
    clock, rwnd = ManualClock(), [0]
    acked = [0]
    watch = UploadWatch(lambda: TcpInfo(state=1, snd_mss=1448, bytes_acked=acked[0], rwnd_limited_us=rwnd[0]), clock)
    watch.sent(1, clock(), 602_112)
    for _ in range(6):
        clock.now += 0.04
        acked[0] += 20_000
        rwnd[0] += 4000  # tcpi_rwnd_limited grows: the window held the sender
        watch.look()
    assert watch.crossing() is None
    assert watch.settled(1).receiver_limited
