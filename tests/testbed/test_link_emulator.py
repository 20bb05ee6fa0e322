"""The link emulator: tbf-shaped namespaces, the delay relay, rate schedules.

Goodput tolerances: a TCP segment carries 1448 payload bytes in a 1514-byte frame (20 IP +
32 TCP with timestamps + 14 Ethernet), and tbf counts whole frames, so the best goodput is
95.6% of the configured rate; slow start and the occasional drop cost a little more. ±15%
around the configured rate covers that with room for a loaded 2-core machine, while a
shaper that is off by a factor (no shaping, wrong unit, one direction only) still fails.
The user-space limiter counts payload bytes, so it is held to ±10%.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import select
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from splitedge.errors import SplitEdgeError
from testbed._kernel_link import GSO_MAX_BYTES, GSO_MAX_SEGS, gso_segments
from testbed import (
    FRAME_BYTES,
    DelayRelay,
    EmulatedLink,
    LinkEmulationError,
    LinkEmulationUnavailable,
    RateSchedule,
    RateStep,
    kernel_link,
    remove_stale_links,
    tbf_parameters,
    unavailable_reason,
)

T = TypeVar("T")
REASON = unavailable_reason()
needs_namespaces = pytest.mark.skipif(REASON is not None, reason=f"link emulation unavailable: {REASON}")

#: Counts received bytes and reports the count (8 bytes, big-endian) every REPORT bytes, so the
#: sender can time the transfer from the receiver's side; serves connections until idle 30 s.
SINK = r"""
import socket, struct, sys
server = socket.socket()
server.bind((sys.argv[1], 0))
server.listen(4)
server.settimeout(30)
report = int(sys.argv[2])
print(server.getsockname()[1], flush=True)
while True:
    try:
        conn, _ = server.accept()
    except socket.timeout:
        break
    with conn:
        conn.settimeout(30)
        total, due = 0, report
        while True:
            data = conn.recv(1 << 16)
            if not data:
                break
            total += len(data)
            while total >= due:
                conn.sendall(struct.pack("!Q", due))
                due += report
server.close()
"""
REPORT = 1 << 16


def run(coro: Awaitable[T], timeout: float = 20.0) -> T:
    """Every async test is bounded in time."""
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


def start_sink(link: EmulatedLink) -> int:
    """Start :data:`SINK` inside the link's namespace and return its port."""
    process = link.popen([sys.executable, "-c", SINK, link.namespace_address, str(REPORT)],
                         stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 10)
    assert ready, "the sink did not start within 10 s"
    return int(process.stdout.readline())


Report = tuple[float, int]  # (loop time, bytes the receiver has counted)


async def transfer(host: str, port: int, nbytes: int,
                   on_report: Callable[[Report], None] | None = None) -> list[Report]:
    """Send ``nbytes`` to a sink and return its reports as they arrived."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection(host, port)
    reports: list[Report] = []

    async def send() -> None:
        chunk = bytes(1 << 16)
        for start in range(0, nbytes, len(chunk)):
            writer.write(chunk[: nbytes - start])
            await writer.drain()

    sending = asyncio.create_task(send())
    try:
        while not reports or reports[-1][1] < nbytes - nbytes % REPORT:
            (count,) = struct.unpack("!Q", await reader.readexactly(8))
            reports.append((loop.time(), count))
            if on_report is not None:
                on_report(reports[-1])
        await sending
    finally:
        sending.cancel()
        writer.close()
        await writer.wait_closed()
    return reports


def mbit_between(reports: list[Report], first_bytes: float, last_bytes: float) -> float:
    """Goodput between the first report at or past ``first_bytes`` and the last at or before ``last_bytes``."""
    start = next(r for r in reports if r[1] >= first_bytes)
    end = [r for r in reports if r[1] <= last_bytes][-1]
    assert end[1] - start[1] >= 4 * REPORT, "too few reports to measure a rate"
    return (end[1] - start[1]) * 8 / 1e6 / (end[0] - start[0])


def netns_exists(name: str) -> bool:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return name in listing.split()


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def qdisc(link: EmulatedLink, inside: bool) -> str:
    netns = ["-n", link.namespace] if inside else []
    dev = link.namespace_interface if inside else link.root_interface
    return subprocess.run(["tc", *netns, "qdisc", "show", "dev", dev], capture_output=True, text=True,
                          check=True).stdout


# --------------------------------------------------------------------------- availability and tbf


def test_unavailable_reason_is_cached_and_says_why() -> None:
    reason = unavailable_reason()
    assert reason is unavailable_reason()
    assert reason is None or reason.strip()


def test_reasons_name_the_missing_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks before any command runs (the cached function's body, called afresh)."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in (unavailable_reason.__wrapped__() or "")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(kernel_link.shutil, "which", lambda tool: None if tool == "tc" else "/usr/sbin/" + tool)
    assert (unavailable_reason.__wrapped__() or "").startswith("tc not found")


def test_entering_a_link_without_support_raises_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_link, "unavailable_reason", lambda: "network namespaces need root")
    link = EmulatedLink(5)
    with pytest.raises(LinkEmulationUnavailable, match="need root"):
        with link:
            pass
    assert issubclass(LinkEmulationUnavailable, RuntimeError) and issubclass(LinkEmulationUnavailable, SplitEdgeError)


@needs_namespaces
def test_stale_links_of_dead_processes_are_removed() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"se-{dead.pid}-0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        subprocess.run(["ip", "link", "add", f"se{dead.pid}-0", "type", "veth", "peer", "name", "veth0",
                        "netns", stale], check=True)
        assert stale in remove_stale_links()
        assert not netns_exists(stale) and not link_exists(f"se{dead.pid}-0")
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)


@pytest.mark.parametrize("rate_mbit", [0.1, 1, 5, 20, 100, 500, 1000])
def test_tbf_burst_covers_a_tick_and_two_frames_and_queue_is_bounded(rate_mbit: float) -> None:
    bits, burst, limit = tbf_parameters(rate_mbit)
    bytes_per_s = rate_mbit * 1e6 / 8
    assert bits == round(rate_mbit * 1e6)
    assert burst >= bytes_per_s / 1000 and burst >= 2 * FRAME_BYTES
    assert burst <= max(bytes_per_s / 100, 2 * FRAME_BYTES) + 1  # never more than one tick at HZ=100
    assert burst <= 2 * (GSO_MAX_BYTES + FRAME_BYTES)  # nor more than two GSO packets passed at once
    queue = limit - burst
    assert queue >= 4 * FRAME_BYTES
    assert queue <= max(bytes_per_s * 0.1, 4 * FRAME_BYTES) + 1  # at most 100 ms of queue...
    assert queue >= bytes_per_s * 0.05  # ... and at least 50 ms


def test_rates_are_validated() -> None:
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="rate_mbit"):
            EmulatedLink(bad)
        with pytest.raises(ValueError, match="rate_mbit"):
            DelayRelay(("127.0.0.1", 1), 0, rate_mbit=bad)
    with pytest.raises(ValueError, match="namespace name"):
        EmulatedLink(5, name="no spaces/allowed")
    with pytest.raises(RuntimeError, match="with"):
        EmulatedLink(5).root_address


# --------------------------------------------------------------------------- EmulatedLink


@needs_namespaces
@pytest.mark.parametrize("rate_mbit, seconds", [(5, 2.5), (20, 2.0)])
def test_goodput_into_the_namespace_matches_the_rate(rate_mbit: float, seconds: float) -> None:
    with EmulatedLink(rate_mbit) as link:
        port = start_sink(link)
        nbytes = int(rate_mbit * 1e6 / 8 * seconds)
        reports = run(transfer(link.namespace_address, port, nbytes))
    measured = mbit_between(reports, 0.1 * nbytes, nbytes)  # past slow start
    print(f"configured {rate_mbit} Mbit/s, measured goodput {measured:.2f} Mbit/s")
    assert rate_mbit * 0.85 <= measured <= rate_mbit * 1.15


@needs_namespaces
def test_goodput_out_of_the_namespace_is_shaped_too() -> None:
    """A sink in the root namespace, a sender in the namespace: the namespace side's tbf."""
    sender = r"""
import socket, struct, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20) as s:
    s.sendall(bytes(int(sys.argv[3])))
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
"""

    async def go(link: EmulatedLink) -> float:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[float, float]] = loop.create_future()
        nbytes = 1_250_000  # 2 s at 5 Mbit/s

        async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            got = 0
            first = 0.0
            while got < nbytes:
                data = await reader.read(1 << 16)
                if not data:
                    break
                if got < 0.1 * nbytes <= got + len(data):
                    first = loop.time()
                    counted = got + len(data)
                got += len(data)
            done.set_result(((got - counted) * 8 / 1e6, loop.time() - first))
            writer.close()

        server = await asyncio.start_server(sink, link.root_address, 0)
        port = server.sockets[0].getsockname()[1]
        process = await asyncio.to_thread(
            link.popen, [sys.executable, "-c", sender, link.root_address, str(port), str(nbytes)])
        try:
            megabits, seconds = await asyncio.wait_for(done, 15)
        finally:
            server.close()
            await asyncio.to_thread(process.wait, 10)
        return megabits / seconds

    with EmulatedLink(5) as link:
        measured = run(go(link))
    print(f"out of the namespace: configured 5 Mbit/s, measured {measured:.2f}")
    assert 5 * 0.85 <= measured <= 5 * 1.15


@needs_namespaces
def test_set_rate_changes_the_rate_mid_transfer() -> None:
    with EmulatedLink(5) as link:
        port = start_sink(link)
        change_at = 1_500_000  # ~2.4 s at 5 Mbit/s, then ~2 s at 20 Mbit/s
        nbytes = change_at + 5_000_000
        changed: list[Report] = []

        def on_report(report: Report) -> None:
            if not changed and report[1] >= change_at:
                link.set_rate(20)
                changed.append(report)

        reports = run(transfer(link.namespace_address, port, nbytes, on_report))
        assert link.rate_mbit == 20
        assert "rate 20Mbit" in qdisc(link, inside=False) and "rate 20Mbit" in qdisc(link, inside=True)
    before = mbit_between(reports, 0.1 * change_at, change_at)
    settled = next(r for r in reports if r[0] >= changed[0][0] + 0.2)[1]  # let the old queue drain
    after = mbit_between(reports, settled, nbytes)
    print(f"set_rate 5 -> 20 Mbit/s: measured {before:.2f} before, {after:.2f} after")
    assert 5 * 0.85 <= before <= 5 * 1.15
    assert 20 * 0.85 <= after <= 20 * 1.15


@needs_namespaces
def test_set_rate_none_removes_shaping_and_back() -> None:
    with EmulatedLink() as link:
        assert link.rate_mbit is None and "tbf" not in qdisc(link, inside=False)
        link.set_rate(2.5)
        assert "rate 2500Kbit" in qdisc(link, inside=False) and "rate 2500Kbit" in qdisc(link, inside=True)
        link.set_rate(None)
        assert "tbf" not in qdisc(link, inside=False) and "tbf" not in qdisc(link, inside=True)
        link.set_rate(None)  # removing no shaping is not an error


@pytest.mark.parametrize("rate_mbit", [0.1, 5, 50, 100, 250, 500, 1000])
def test_offloads_stay_on_only_where_the_bucket_holds_a_whole_gso_packet(rate_mbit: float) -> None:
    burst = tbf_parameters(rate_mbit)[1]
    expected = GSO_MAX_SEGS if burst >= GSO_MAX_BYTES + FRAME_BYTES else 1
    assert gso_segments(rate_mbit) == expected
    if rate_mbit <= 50:  # the measured RTO stalls: never a GSO packet on a slow link, whatever HZ
        assert expected == 1


def gso_max_segs(link: EmulatedLink, inside: bool) -> int:
    prefix = ["-n", link.namespace] if inside else []
    dev = link.namespace_interface if inside else link.root_interface
    out = subprocess.run(["ip", *prefix, "-d", "link", "show", "dev", dev], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split("gso_max_segs", 1)[1].split()[0])


@needs_namespaces
def test_both_ends_follow_the_rate_in_packet_size() -> None:
    with EmulatedLink(5) as link:
        assert gso_max_segs(link, inside=False) == 1 and gso_max_segs(link, inside=True) == 1
        link.set_rate(500)
        assert gso_max_segs(link, inside=False) == GSO_MAX_SEGS and gso_max_segs(link, inside=True) == GSO_MAX_SEGS
        link.set_rate(50)
        assert gso_max_segs(link, inside=False) == 1 and gso_max_segs(link, inside=True) == 1
        link.set_rate(None)  # unshaped: it may be slowed later under connections it already carries
        assert gso_max_segs(link, inside=False) == 1 and gso_max_segs(link, inside=True) == 1


@needs_namespaces
def test_exit_deletes_namespace_veth_and_processes() -> None:
    with EmulatedLink(10) as link:
        process = link.popen(["sleep", "60"])
        assert netns_exists(link.namespace) and link_exists(link.root_interface)
    assert process.poll() is not None
    assert not netns_exists(link.namespace) and not link_exists(link.root_interface)


@needs_namespaces
def test_exit_after_an_exception_still_cleans_up() -> None:
    link = EmulatedLink(10)
    with pytest.raises(ZeroDivisionError):
        with link:
            1 / 0
    assert not netns_exists(link.namespace) and not link_exists(link.root_interface)


@needs_namespaces
def test_a_failure_half_way_through_setup_removes_what_was_made() -> None:
    link = EmulatedLink(1e12)  # tc refuses the burst this needs, after the namespace and veth exist
    with pytest.raises(LinkEmulationError, match="tbf"):
        with link:
            pass
    assert not netns_exists(link.namespace) and not link_exists(link.root_interface)


@needs_namespaces
def test_failed_setup_does_not_delete_a_namespace_it_did_not_make() -> None:
    with EmulatedLink() as first:
        with pytest.raises(LinkEmulationUnavailable, match="exists"):
            with EmulatedLink(name=first.namespace):
                pass
        assert netns_exists(first.namespace)


@needs_namespaces
def test_two_links_at_once_get_distinct_addresses_and_their_own_rates() -> None:
    async def go(slow: EmulatedLink, fast: EmulatedLink, ports: tuple[int, int]) -> tuple[float, float]:
        a, b = await asyncio.gather(transfer(slow.namespace_address, ports[0], 1_000_000),
                                    transfer(fast.namespace_address, ports[1], 4_000_000))
        return mbit_between(a, 100_000, 1_000_000), mbit_between(b, 400_000, 4_000_000)

    with EmulatedLink(5) as slow, EmulatedLink(20) as fast:
        assert slow.namespace != fast.namespace and slow.root_interface != fast.root_interface
        addresses = {slow.root_address, slow.namespace_address, fast.root_address, fast.namespace_address}
        assert len(addresses) == 4
        assert all(ipaddress.IPv4Address(a) in ipaddress.IPv4Network("10.213.0.0/16") for a in addresses)
        for link in (slow, fast):
            last = int(link.namespace_address.rsplit(".", 1)[1])
            assert last % 4 == 2 and int(link.root_address.rsplit(".", 1)[1]) == last - 1
        slow_mbit, fast_mbit = run(go(slow, fast, (start_sink(slow), start_sink(fast))))
    print(f"two links at once: 5 Mbit/s -> {slow_mbit:.2f}, 20 Mbit/s -> {fast_mbit:.2f}")
    assert 5 * 0.85 <= slow_mbit <= 5 * 1.15
    assert 20 * 0.85 <= fast_mbit <= 20 * 1.15


@needs_namespaces
def test_async_with_and_a_schedule_driving_the_kernel_link() -> None:
    async def go() -> tuple[list[tuple[float, float]], str, str]:
        changes: list[tuple[float, float]] = []
        async with EmulatedLink() as link:
            await RateSchedule.parse("3:0.2,30:0.2").drive(link, lambda t, r: changes.append((t, r)))
            outside, inside = await asyncio.to_thread(qdisc, link, False), await asyncio.to_thread(qdisc, link, True)
        assert not netns_exists(link.namespace)
        return changes, outside, inside

    changes, outside, inside = run(go())
    assert [rate for _, rate in changes] == [3, 30]
    # Applied at its time, never before it; how late depends on tc and the machine's load (on a
    # busy 2-core machine tc alone took over 50 ms), so only a stall past a second fails here.
    assert 0.2 - 0.005 <= changes[1][0] < 1.2
    assert "rate 30Mbit" in outside and "rate 30Mbit" in inside


# --------------------------------------------------------------------------- DelayRelay


async def echo_server() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0)


def port_of(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


def test_relay_round_trip_takes_twice_the_delay() -> None:
    async def go() -> list[float]:
        loop = asyncio.get_running_loop()
        async with await echo_server() as server, DelayRelay(("127.0.0.1", port_of(server)), 40) as relay:
            reader, writer = await asyncio.open_connection(*relay.address)
            times = []
            for _ in range(3):
                start = loop.time()
                writer.write(b"ping-0123456789a")
                assert await reader.readexactly(16) == b"ping-0123456789a"
                times.append(loop.time() - start)
            writer.close()
            await writer.wait_closed()
        return times

    times = run(go())
    print("round trips through a 40 ms relay (ms):", [round(t * 1000, 1) for t in times])
    assert min(times) >= 0.080
    assert sorted(times)[1] < 0.080 + 0.030


def test_relay_pipelines_instead_of_one_message_per_round_trip() -> None:
    count, size = 100, 1024

    async def go() -> float:
        loop = asyncio.get_running_loop()
        async with await echo_server() as server, DelayRelay(("127.0.0.1", port_of(server)), 40) as relay:
            reader, writer = await asyncio.open_connection(*relay.address)
            start = loop.time()
            for i in range(count):
                writer.write(bytes([i]) * size)
            await writer.drain()
            echoed = await reader.readexactly(count * size)
            elapsed = loop.time() - start
            writer.close()
            await writer.wait_closed()
        assert echoed == b"".join(bytes([i]) * size for i in range(count))
        return elapsed

    elapsed = run(go())
    print(f"{count} messages back-to-back through a 40 ms relay: {elapsed * 1000:.0f} ms")
    assert 0.080 <= elapsed < 0.080 + 0.100  # one round trip, not count x 80 ms


def test_relay_delivers_bytes_unchanged_and_in_order() -> None:
    payload = os.urandom(4 << 20)

    async def go() -> bytes:
        async with await echo_server() as server, DelayRelay(("127.0.0.1", port_of(server)), 5) as relay:
            reader, writer = await asyncio.open_connection(*relay.address)

            async def send() -> None:
                for start in range(0, len(payload), 100_003):  # odd sizes: chunk edges move around
                    writer.write(payload[start:start + 100_003])
                    await writer.drain()

            sending = asyncio.create_task(send())
            echoed = await reader.readexactly(len(payload))
            await sending
            writer.close()
            await writer.wait_closed()
        return echoed

    assert hashlib.sha256(run(go())).hexdigest() == hashlib.sha256(payload).hexdigest()


@pytest.mark.parametrize(("rate_mbit", "hog_ms"), [(4, 0), (40, 0), (0.5, 100), (4, 20)])
def test_relay_rate_limit(rate_mbit: float, hog_ms: float) -> None:
    """The configured rate, measured at the receiver, within 10 %. ``hog_ms``: a task blocks the
    relay's event loop that long at each turn, as a loop starved of CPU wakes late: the relay still
    carries the rate within 20 % (0.92 and 0.98 of it here; 0.16 and 0.33 before the time it
    overslept was credited, and a request through it timed out in test_dynamic_split)."""
    async def hog() -> None:
        while True:
            time.sleep(hog_ms / 1000)
            await asyncio.sleep(0)

    async def go() -> float:
        loop = asyncio.get_running_loop()
        hogging = asyncio.create_task(hog()) if hog_ms else None
        got: list[tuple[float, int]] = []
        nbytes = int(rate_mbit * 1e6 / 8 * 2)  # 2 s

        async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            total = 0
            while data := await reader.read(1 << 16):
                total += len(data)
                got.append((loop.time(), total))
            writer.close()

        async with await asyncio.start_server(sink, "127.0.0.1", 0) as server, \
                DelayRelay(("127.0.0.1", port_of(server)), 10, rate_mbit=rate_mbit) as relay:
            _, writer = await asyncio.open_connection(*relay.address)
            writer.write(bytes(nbytes))
            await writer.drain()
            while not got or got[-1][1] < nbytes:
                await asyncio.sleep(0.05)
            writer.close()
            await writer.wait_closed()
        if hogging is not None:
            hogging.cancel()
        start = next(g for g in got if g[1] >= nbytes * 0.1)
        return (got[-1][1] - start[1]) * 8 / 1e6 / (got[-1][0] - start[0])

    measured = run(go())
    print(f"relay rate limit: configured {rate_mbit} Mbit/s, loop blocked {hog_ms} ms a turn, measured {measured:.2f}")
    assert rate_mbit * (0.8 if hog_ms else 0.9) <= measured <= rate_mbit * 1.1


def test_relay_bounds_what_it_buffers_for_a_receiver_that_does_not_read() -> None:
    async def go() -> tuple[int, int]:
        idle: list[asyncio.StreamWriter] = []

        async def never_reads(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            idle.append(writer)

        async with await asyncio.start_server(never_reads, "127.0.0.1", 0) as server, \
                DelayRelay(("127.0.0.1", port_of(server)), 1, max_buffered_bytes=1 << 20) as relay:
            _, writer = await asyncio.open_connection(*relay.address)
            chunk = bytes(1 << 16)

            async def flood() -> None:
                for _ in range(1024):  # 64 MiB: far more than every socket buffer on the way
                    writer.write(chunk)
                    await writer.drain()

            flooding = asyncio.create_task(flood())
            peak = 0
            for _ in range(30):  # 1.5 s
                await asyncio.sleep(0.05)
                peak = max(peak, relay.buffered_bytes)
            assert not flooding.done(), "64 MiB went through a receiver that reads nothing"
            flooding.cancel()
            writer.transport.abort()
            for w in idle:
                w.transport.abort()
        return peak, relay.buffered_bytes

    peak, after = run(go())
    assert 0 < peak <= (1 << 20) + (1 << 16)
    assert after == 0


def test_relay_closes_the_other_side_after_the_delay() -> None:
    async def go() -> tuple[float, bytes]:
        loop = asyncio.get_running_loop()
        eof_seen: asyncio.Future[float] = loop.create_future()

        async def wait_for_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert await reader.read() == b"bye"
            eof_seen.set_result(loop.time())
            writer.close()

        async def closes_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"done")
            writer.close()

        async with await asyncio.start_server(wait_for_eof, "127.0.0.1", 0) as server, \
                DelayRelay(("127.0.0.1", port_of(server)), 30) as relay:
            _, writer = await asyncio.open_connection(*relay.address)
            writer.write(b"bye")
            closed_at = loop.time()
            writer.close()
            await writer.wait_closed()
            latency = await asyncio.wait_for(eof_seen, 5) - closed_at

        async with await asyncio.start_server(closes_at_once, "127.0.0.1", 0) as server, \
                DelayRelay(("127.0.0.1", port_of(server)), 30) as relay:
            reader, writer = await asyncio.open_connection(*relay.address)
            received = await asyncio.wait_for(reader.read(), 5)  # the data, then EOF
            writer.close()
            await writer.wait_closed()
        return latency, received

    latency, received = run(go())
    assert latency >= 0.030
    assert received == b"done"


def test_relay_to_a_dead_target_closes_the_client() -> None:
    async def go() -> bytes:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = port_of(server)
        server.close()
        await server.wait_closed()
        async with DelayRelay(("127.0.0.1", port), 5) as relay:
            reader, writer = await asyncio.open_connection(*relay.address)
            data = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            return data

    assert run(go()) == b""


def test_relay_set_delay_applies_to_new_data() -> None:
    async def go() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        async with await echo_server() as server, DelayRelay(("127.0.0.1", port_of(server)), 60) as relay:
            assert relay.delay_ms == 60
            reader, writer = await asyncio.open_connection(*relay.address)
            rtts = []
            for delay in (60, 10):
                relay.set_delay(delay)
                start = loop.time()
                writer.write(b"x")
                await reader.readexactly(1)
                rtts.append(loop.time() - start)
            writer.close()
            await writer.wait_closed()
        return rtts[0], rtts[1]

    slow, fast = run(go())
    assert slow >= 0.120
    assert 0.020 <= fast < 0.060
    with pytest.raises(ValueError, match="delay_ms"):
        DelayRelay(("127.0.0.1", 1), -1)


# --------------------------------------------------------------------------- RateSchedule


def test_parse_and_rate_at() -> None:
    schedule = RateSchedule.parse("1:10, 50:10,5:10")
    assert schedule.steps == (RateStep(10, 1), RateStep(10, 50), RateStep(10, 5))
    assert schedule.duration_s == 30
    assert [schedule.rate_at(t) for t in (0, 9.99, 10, 19.9, 20, 29.9, 30, 1000)] == [1, 1, 50, 50, 5, 5, 5, 5]
    looping = RateSchedule.parse("1:10,50:10,5:10", repeat=True)
    assert [looping.rate_at(t) for t in (30, 45, 59.9, 61)] == [1, 50, 5, 1]
    assert RateSchedule.parse("0.5:0.25").steps == (RateStep(0.25, 0.5),)
    with pytest.raises(ValueError, match="elapsed_s"):
        schedule.rate_at(-1)


@pytest.mark.parametrize("text, names", [
    ("", "step 1"),
    ("5", "step 1 '5'.*RATE_MBIT:DURATION_S"),
    ("1:10,x:10", "step 2 'x:10'.*rate 'x' is not a number"),
    ("1:10,5:ten", "step 2 '5:ten'.*duration 'ten' is not a number"),
    ("1:10,,5:10", "step 2 ''"),
    ("0:10", "step 1 '0:10'.*rate must be a positive"),
    ("5:-1", "step 1 '5:-1'.*duration must be a positive"),
    ("5:1:2", "step 1 '5:1:2'"),
    ("nan:1", "rate must be a positive"),
])
def test_parse_errors_name_the_bad_part(text: str, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        RateSchedule.parse(text)


def test_steps_and_schedules_are_validated() -> None:
    with pytest.raises(ValueError, match="duration_s"):
        RateStep(0, 5)
    with pytest.raises(ValueError, match="rate_mbit"):
        RateStep(1, 0)
    with pytest.raises(ValueError, match="at least one step"):
        RateSchedule([])


def test_drive_applies_each_rate_at_its_time() -> None:
    async def go() -> tuple[list[tuple[float, float]], float, Any]:
        loop = asyncio.get_running_loop()
        changes: list[tuple[float, float]] = []
        seen_by_relay: list[float | None] = []
        async with await echo_server() as server, DelayRelay(("127.0.0.1", port_of(server)), 0) as relay:
            def on_change(elapsed: float, rate: float) -> None:
                changes.append((elapsed, rate))
                seen_by_relay.append(relay.rate_mbit)

            start = loop.time()
            await RateSchedule.parse("10:0.2,20:0.3,5:0.2").drive(relay, on_change)
            total = loop.time() - start
        return changes, total, seen_by_relay

    changes, total, seen = run(go())
    assert [rate for _, rate in changes] == [10, 20, 5] == [pytest.approx(s) for s in seen]
    for (elapsed, _), expected in zip(changes, (0.0, 0.2, 0.5)):
        assert elapsed == pytest.approx(expected, abs=0.05)
    assert total == pytest.approx(0.7, abs=0.05)


def test_drive_repeats_until_cancelled() -> None:
    async def go() -> list[tuple[float, float]]:
        changes: list[tuple[float, float]] = []
        relay = DelayRelay(("127.0.0.1", 1), 0)  # never started: set_rate needs no listener
        task = asyncio.create_task(RateSchedule.parse("1:0.1,2:0.1", repeat=True).drive(
            relay, lambda t, r: changes.append((t, r))))
        await asyncio.sleep(0.45)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert relay.rate_mbit == changes[-1][1]
        return changes

    changes = run(go())
    assert [rate for _, rate in changes] == [1, 2, 1, 2, 1]
    for (elapsed, _), expected in zip(changes, (0.0, 0.1, 0.2, 0.3, 0.4)):
        assert elapsed == pytest.approx(expected, abs=0.05)
