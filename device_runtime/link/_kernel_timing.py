"""The link as the kernel sees it: the host connection's ``TCP_INFO`` and its timestamps.

A board that times its requests by its own clock counts as link time everything its own CPU
makes the request and the reply wait for: the head in the next thread holding the GIL, the
event loop busy with the next cut, the scheduler running another process first. On loopback,
which carries 600 KB in ~0.1 ms, a few ms of that read as 2-16 Mbit/s where ``calibrate`` had
measured 33-45 Gbit/s (issue 14). The kernel times the same transfer without waiting for us:

* **the upload's ACKs** (``SO_TIMESTAMPING`` with ``SOF_TIMESTAMPING_TX_ACK | OPT_ID``,
  Documentation/networking/timestamping.rst): the kernel stamps the moment the host's ACK of
  each write's last byte arrives, keyed by that byte's offset, and queues the stamp on the
  socket's error queue; the client drains it before every read (the queue wakes the event loop
  as data would). A request's upload took from its write to that stamp.
* **looks at ``TCP_INFO``** (``struct tcp_info``, linux/include/uapi/linux/tcp.h) while an
  upload crosses (:class:`UploadWatch`): ``tcpi_bytes_acked`` at two looks that both find
  bytes of it unacknowledged gives the rate the link carried meanwhile (a look that the board's
  CPU delays is a later look, not a wrong one); a look that finds it acknowledged bounds its
  time; ``tcpi_min_rtt`` is the path's own round trip; ``tcpi_rwnd_limited`` growing says the
  host's receive window, not the link, held the upload back.
* **the reply's arrival** (``SO_TIMESTAMPNS``): each segment is stamped as it arrives, in the
  softirq, whatever user space is doing. Peeked (``MSG_PEEK``, nothing consumed) just before
  the event loop reads, the first unread byte's stamp is when the reply reached this board;
  how long it then waited for us comes off the round trip.

Each ``tcp_info`` field is read only if the kernel's struct is long enough to have it
(``tcpi_bytes_acked`` since Linux 4.1, ``tcpi_min_rtt`` 4.6, ``tcpi_delivery_rate`` 4.9,
``tcpi_rwnd_limited`` 4.10): an older kernel's missing fields are None, and where a piece is
missing (not Linux, TLS, an old kernel) the device's own timing stands in
(:class:`~device_runtime.hosts._link_meter.LinkMeter`); ``split-device info`` says which.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = [
    "KernelTiming", "KernelTimingSupport", "TcpInfo", "UploadTiming", "UploadWatch", "kernel_timing_support",
    "parse_tcp_info", "read_tcp_info",
]

#: ``SO_TIMESTAMPNS`` (asm-generic/socket.h; also x86 and arm64): Python does not name it.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
#: Room for everything this module reads and more: a newer kernel's longer struct is cut here.
TCP_INFO_BYTES = 256
_TCP_INFO = getattr(socket, "TCP_INFO", None) if sys.platform.startswith("linux") else None

# (name, offset, struct format) in struct tcp_info (linux/include/uapi/linux/tcp.h): eight
# __u8, then __u32 from tcpi_rto at 8, the __u64 from tcpi_pacing_rate at 104 (naturally
# aligned), the kernel's own byte order. A field lies past a short struct's end: None.
_FIELDS = (
    ("state", 0, "B"),
    ("snd_mss", 16, "I"),
    ("unacked", 24, "I"),  # segments sent and not yet acknowledged
    ("last_data_recv_ms", 52, "I"),  # jiffies: 4 ms steps at HZ=250
    ("rtt_us", 68, "I"),  # smoothed
    ("rttvar_us", 72, "I"),
    ("bytes_acked", 120, "Q"),
    ("notsent_bytes", 144, "I"),  # written by the application, not yet sent
    ("min_rtt_us", 148, "I"),
    ("delivery_rate", 160, "Q"),  # bytes per second
    ("rwnd_limited_us", 176, "Q"),  # time the peer's receive window held the sender back, cumulative (jiffies)
    ("delivered", 192, "I"),  # segments delivered (acknowledged), cumulative
)
#: The byte holding ``tcpi_delivery_rate_app_limited:1`` (its lowest bit: GCC's bit-field order).
_APP_LIMITED_BYTE = 7


@dataclass(frozen=True)
class TcpInfo:
    """What this runtime reads of one ``struct tcp_info``; None where the kernel's struct is too short."""

    state: int
    snd_mss: int | None = None
    unacked: int | None = None
    last_data_recv_ms: int | None = None
    rtt_us: int | None = None
    rttvar_us: int | None = None
    bytes_acked: int | None = None
    notsent_bytes: int | None = None
    min_rtt_us: int | None = None
    delivery_rate: int | None = None  # bytes/s
    rwnd_limited_us: int | None = None
    delivered: int | None = None
    app_limited: bool | None = None  # tcpi_delivery_rate_app_limited, with delivery_rate

    @property
    def delivery_rate_bps(self) -> float | None:
        """``tcpi_delivery_rate`` in bit/s; None without one (an old kernel, or no sample yet: 0)."""
        return 8.0 * self.delivery_rate if self.delivery_rate else None


def _layout(fields: tuple[tuple[str, int, str], ...]) -> struct.Struct:
    """One format reading every field at its offset (pad bytes between): a whole struct is read in
    one ``unpack_from``, not one call and one format lookup per field (a board reads it twice a request)."""
    fmt, end = "=", 0
    for _, offset, kind in fields:
        fmt += f"{offset - end}x{kind}" if offset > end else kind
        end = offset + struct.calcsize("=" + kind)
    return struct.Struct(fmt)


_WHOLE = _layout(_FIELDS)
_NAMES = tuple(name for name, _, _ in _FIELDS)
_EACH = tuple((name, offset, struct.Struct("=" + kind)) for name, offset, kind in _FIELDS)


def parse_tcp_info(raw: bytes) -> TcpInfo:
    """``struct tcp_info`` as ``getsockopt(IPPROTO_TCP, TCP_INFO)`` returned it, however long.

    Each field is read only when ``raw`` reaches its end: the kernel copies
    ``min(len, sizeof(struct tcp_info))`` bytes, so an older kernel's struct ends early. Fewer
    than 8 bytes (not even the state) is not a tcp_info: ValueError.
    """
    if len(raw) < 8:
        raise ValueError(f"tcp_info of {len(raw)} bytes: shorter than its first 8 fields")
    if len(raw) >= _WHOLE.size:  # a kernel since 4.18: every field, in one call
        values: dict[str, Any] = dict(zip(_NAMES, _WHOLE.unpack_from(raw)))
    else:
        values = {name: field.unpack_from(raw, offset)[0]
                  for name, offset, field in _EACH if offset + field.size <= len(raw)}
    if "delivery_rate" in values:
        values["app_limited"] = bool(raw[_APP_LIMITED_BYTE] & 1)
    return TcpInfo(**values)


def read_tcp_info(sock: socket.socket | None) -> TcpInfo | None:
    """The connection's ``TCP_INFO`` now; None where there is none (not Linux, not TCP, closed)."""
    if sock is None or _TCP_INFO is None:
        return None
    try:
        return parse_tcp_info(sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, TCP_INFO_BYTES))
    except (OSError, ValueError):
        return None


def enable_rx_timestamps(sock: socket.socket | None) -> bool:
    """Ask the kernel to stamp arriving segments; False where it will not."""
    if sock is None or not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


_CMSG_SPACE = socket.CMSG_SPACE(16)  # one struct timespec (two 64-bit fields; 32-bit: two 32-bit)
_PEEK = int(socket.MSG_PEEK | getattr(socket, "MSG_DONTWAIT", 0))  # a plain int: or-ing the enum costs more than the call


def arrival_lag_s(sock: socket.socket, clock: Callable[[], float] = time.time) -> float | None:
    """How long the first unread byte has waited in the kernel for this process: now less its
    receive timestamp. None when nothing is waiting or no stamp came with it (the stamp is
    ``CLOCK_REALTIME``, as ``time.time``)."""
    try:
        data, ancillary, _, _ = sock.recvmsg(1, _CMSG_SPACE, _PEEK)
    except OSError:  # nothing to read (EAGAIN), or the connection went: the read says which
        return None
    now = clock()
    if not data:
        return None
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            stamp = _timespec(payload)
            if stamp is None:
                return None
            lag = now - stamp
            # A negative lag is a clock step between the stamp and now.
            return lag if 0.0 <= lag < 60.0 else None
    return None


#: SO_TIMESTAMPING (asm-generic/socket.h) and its flags (linux/net_tstamp.h): stamp each
#: write's last byte when the peer's ACK for it arrives, in software, keyed by its offset.
SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_OPT_ID = 1 << 7
SOF_TIMESTAMPING_TX_ACK = 1 << 9
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
_ACK_STAMPS = SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_ID | SOF_TIMESTAMPING_TX_ACK | SOF_TIMESTAMPING_OPT_TSONLY
_MSG_ERRQUEUE = getattr(socket, "MSG_ERRQUEUE", 0x2000)
_DRAIN = int(_MSG_ERRQUEUE | getattr(socket, "MSG_DONTWAIT", 0))
#: struct sock_extended_err (linux/errqueue.h) comes as IP_RECVERR (IPv4) or IPV6_RECVERR.
_RECVERR = {(getattr(socket, "SOL_IP", 0), getattr(socket, "IP_RECVERR", 11)),
            (getattr(socket, "SOL_IPV6", 41), getattr(socket, "IPV6_RECVERR", 25))}
_SO_EE_ORIGIN_TIMESTAMPING = 4
_SCM_TSTAMP_ACK = 2
_ERRQUEUE_SPACE = 512


def _timespec(payload: bytes) -> float | None:
    """A ``struct timespec`` (64- or 32-bit) in seconds; None when short or zero (no stamp)."""
    if len(payload) >= 16:
        seconds, nanoseconds = struct.unpack_from("=qq", payload)
    elif len(payload) >= 8:
        seconds, nanoseconds = struct.unpack_from("=ii", payload)
    else:
        return None
    return seconds + nanoseconds * 1e-9 if seconds or nanoseconds else None


def ack_stamps(sock: socket.socket) -> list[tuple[int, float]]:
    """Drain the socket's error queue of ACK stamps: ``(key, stamp)`` for each, ``key`` the
    offset of a write's last byte (counted from when the stamps were turned on) and ``stamp``
    when the peer's ACK for it arrived (``CLOCK_REALTIME``, as ``time.time``). Anything else
    queued there is dropped."""
    stamps = []
    for _ in range(256):  # bounded: one per write since the last drain
        try:
            _, ancillary, _, _ = sock.recvmsg(1, _ERRQUEUE_SPACE, _DRAIN)
        except OSError:  # empty (EAGAIN)
            break
        stamp, key = None, None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING:
                stamp = _timespec(payload)  # ts[0]: the software stamp
            elif (level, kind) in _RECVERR and len(payload) >= 16:
                _, origin, _, _, _, info, data = struct.unpack_from("=IBBBBII", payload)
                if origin == _SO_EE_ORIGIN_TIMESTAMPING and info == _SCM_TSTAMP_ACK:
                    key = data
        if stamp is not None and key is not None:
            stamps.append((key, stamp))
    return stamps


class KernelTiming:
    """The kernel's view of one connection: its ``TCP_INFO`` and how long a reply has waited.

    The client reads :meth:`tcp_info` before a request goes out and after its reply, and
    :meth:`reply_lag_s` just before each read. A test gives the client a stand-in with the same
    two methods, and so decides what the kernel says.
    """

    def __init__(self, sock: Any, stamps: bool = True) -> None:
        """``sock``: the transport's socket (asyncio's wrapper is fine for ``getsockopt``);
        ``stamps``: peek receive timestamps (not under TLS, whose layer reads ahead of us)."""
        self._sock = sock
        self._peek: socket.socket | None = None
        if stamps and sock is not None:
            try:
                peek = sock.dup()  # a plain socket on the same connection: asyncio's wrapper cannot recvmsg
            except (OSError, AttributeError):
                peek = None
            if peek is not None and enable_rx_timestamps(peek):
                self._peek = peek
            elif peek is not None:
                peek.close()
        self.stamps = self._peek is not None
        self.ack_stamps = False  # the peer's ACK of each write stamped (SO_TIMESTAMPING)
        if self._peek is not None:
            try:
                self._peek.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _ACK_STAMPS)
                self.ack_stamps = True
            except OSError:
                pass

    def tcp_info(self) -> TcpInfo | None:
        return read_tcp_info(self._sock)

    def reply_lag_s(self) -> float | None:
        return arrival_lag_s(self._peek) if self._peek is not None else None

    def acks(self) -> list[tuple[int, float]]:
        """The ACK stamps queued since the last call (:func:`ack_stamps`)."""
        return ack_stamps(self._peek) if self.ack_stamps and self._peek is not None else []

    def close(self) -> None:
        if self._peek is not None:
            self._peek.close()  # the duplicate only: the connection is the transport's to close
            self._peek = None


#: The first look at an upload in flight, after the one right after its write ...
POLL_FIRST_S = 0.001
#: ... then each this share of its age later: the last look before it is done is at most this
#: much of its time short of the end, whatever the rate, in a handful of looks per upload.
POLL_GROWTH = 0.25
#: ... but never longer apart than this: an upload crossing slowly is watched as it goes (:meth:`UploadWatch.crossing`).
POLL_MAX_S = 0.05
#: The rate an upload is crossing at now: over its looks of the last this long.
CROSSING_WINDOW_S = 0.2
#: Acknowledged bytes over at least this long, and this many segments, make a rate sample.
MIN_SPAN_S = 0.0005
MIN_SPAN_SEGMENTS = 2


@dataclass(frozen=True)
class UploadTiming:
    """What ``TCP_INFO`` showed of one request's upload, on the board's clock.

    ``acked_bps`` is the rate at which the kernel saw the link acknowledge bytes while this
    upload was still crossing: ``tcpi_bytes_acked`` at two looks over the time between them.
    Both looks found bytes of the request unacknowledged, so the link was busy with queued
    data all along (this request's or the ones before it) and the rate is the link's, however
    late the looks came: a look that the board's CPU delays is a later look, not a wrong one.
    ``done_s`` is when a look first found the whole request acknowledged (before its reply
    came): the upload took at most that long, a path round trip (``min_rtt_s``) included.
    """

    done_s: float | None = None  # sent → the first look that found it acknowledged
    acked_bps: float | None = None  # bytes acknowledged per second while it crossed, in bit/s
    span_s: float = 0.0  # ... measured over this long
    min_rtt_s: float = 0.0  # tcpi_min_rtt
    # The host's receive window held the upload back meanwhile (tcpi_rwnd_limited grew): the host
    # did not read (busy, or it stops reading a connection with enough requests in flight), so
    # the upload's time is partly the host's, and says nothing sure of the link.
    receiver_limited: bool = False
    # done_s is the kernel's stamp of the ACK of the request's last byte (SO_TIMESTAMPING), not a look
    stamped: bool = False


class UploadWatch:
    """Looks at ``TCP_INFO`` while requests cross, for :class:`UploadTiming`.

    The client calls :meth:`sent` after writing a request (one look at once), and
    :meth:`settled` when its reply came; in between :meth:`look` runs on the event loop's timer
    (``POLL_FIRST_S``, then ``POLL_GROWTH`` of the oldest upload's age) until none is crossing.
    """

    def __init__(self, info: Callable[[], TcpInfo | None], clock: Callable[[], float] = time.perf_counter) -> None:
        self._info = info
        self._clock = clock
        self._uploads: dict[int, _Upload] = {}
        self.min_rtt_s = 0.0

    def sent(self, key: int, start: float, end: int) -> bool:
        """Request ``key`` was written at ``start``, its last byte at stream offset ``end``; one
        look at once. Returns whether anything is still crossing (another look is due)."""
        self._uploads[key] = _Upload(start, end)
        return self.look() is not None

    def look(self) -> float | None:
        """Read ``TCP_INFO`` once for every upload crossing; returns the delay to the next look
        (None: nothing is crossing, or there is no ``tcpi_bytes_acked`` here)."""
        info = self._info()
        if info is None or info.bytes_acked is None:
            return None
        now = self._clock()
        if info.min_rtt_us:
            self.min_rtt_s = info.min_rtt_us * 1e-6
        # The last segment may wait for the reply to carry its ACK (a delayed ACK): up to one
        # segment short of the end is across.
        slack = info.snd_mss or 0
        oldest = None
        for upload in self._uploads.values():
            if upload.done is not None:
                continue
            if upload.rwnd is None:
                upload.rwnd = info.rwnd_limited_us
            if info.bytes_acked + slack >= upload.end:
                upload.done = now
                upload.rwnd_done = info.rwnd_limited_us
            else:
                upload.looks.append((now, info.bytes_acked, slack, info.rwnd_limited_us))
                oldest = upload.start if oldest is None else min(oldest, upload.start)
        if oldest is None:
            return None
        return min(max(POLL_FIRST_S, POLL_GROWTH * (now - oldest)), POLL_MAX_S)

    def crossing(self) -> tuple[float, float] | None:
        """``(bit/s, span_s)``: the rate the link has acknowledged the oldest upload still crossing
        at over its looks of the last ``CROSSING_WINDOW_S``; None before two such looks. What a
        slow upload shows before it is done: after a rate drop, a 602 KB frame takes a second at
        5 Mbit/s, and its first look a tenth of that says so."""
        crossing = [u for u in self._uploads.values() if u.done is None and len(u.looks) >= 2]
        if not crossing:
            return None
        looks = min(crossing, key=lambda u: u.start).looks
        t1, acked1, mss, rwnd1 = looks[-1]
        t0, acked0, _, rwnd0 = next(look for look in looks if look[0] >= t1 - CROSSING_WINDOW_S)
        if t1 - t0 < MIN_SPAN_S or acked1 - acked0 < MIN_SPAN_SEGMENTS * max(mss, 1):
            return None
        if rwnd0 is not None and rwnd1 is not None and rwnd1 > rwnd0:
            return None  # the host's receive window held it back meanwhile: the host's pace, not the link's
        return 8.0 * (acked1 - acked0) / (t1 - t0), t1 - t0

    def acked(self, offset: int, at: float) -> None:
        """The kernel stamped the ACK of the stream's byte ``offset`` (0-based) at ``at`` (this
        watch's clock): every upload ending at or before it was across then, to the µs."""
        for upload in self._uploads.values():
            if upload.end - 1 <= offset and (upload.done is None or at < upload.done):
                upload.done = at
                upload.stamped = True

    def settled(self, key: int) -> UploadTiming | None:
        """Request ``key``'s reply came (or it failed): what the looks showed of its upload."""
        upload = self._uploads.pop(key, None)
        if upload is None:
            return None
        rwnd_end = upload.rwnd_done
        if rwnd_end is None:
            info = self._info()
            rwnd_end = info.rwnd_limited_us if info is not None else None
        limited = upload.rwnd is not None and rwnd_end is not None and rwnd_end > upload.rwnd
        done_s = None if upload.done is None else upload.done - upload.start
        rate, span = None, 0.0
        # From the first look after the write (the one at the write itself may precede a burst
        # that a shaper lets through at wire speed) to the last that found it crossing.
        looks = upload.looks[1:] if len(upload.looks) > 2 else upload.looks
        if len(looks) >= 2:
            (t0, acked0, mss, _), (t1, acked1, _, _) = looks[0], looks[-1]
            if t1 - t0 >= MIN_SPAN_S and acked1 - acked0 >= MIN_SPAN_SEGMENTS * max(mss, 1):
                rate, span = 8.0 * (acked1 - acked0) / (t1 - t0), t1 - t0
        return UploadTiming(done_s, rate, span, self.min_rtt_s, limited, upload.stamped)


class _Upload:
    __slots__ = ("start", "end", "done", "looks", "rwnd", "rwnd_done", "stamped")

    def __init__(self, start: float, end: int) -> None:
        self.start = start
        self.end = end
        self.done: float | None = None
        # (clock, tcpi_bytes_acked, tcpi_snd_mss, tcpi_rwnd_limited) at each look while crossing
        self.looks: list[tuple[float, int, int, int | None]] = []
        self.rwnd: int | None = None  # tcpi_rwnd_limited at the first look ...
        self.rwnd_done: int | None = None  # ... and at the one that found it acknowledged
        self.stamped = False  # done is the kernel's ACK stamp


@dataclass(frozen=True)
class KernelTimingSupport:
    """What this machine's kernel gives the link estimate (``split-device info``)."""

    tcp_info: bool  # TCP_INFO with tcpi_bytes_acked: looks at uploads crossing
    ack_stamps: bool  # SO_TIMESTAMPING's ACK stamps on TCP
    rx_timestamps: bool  # SO_TIMESTAMPNS on TCP: the replies' arrival
    reason: str | None = None  # what is missing, and why

    def describe(self) -> str:
        parts = [name for have, name in ((self.tcp_info, "TCP_INFO"), (self.ack_stamps, "ACK stamps"),
                                         (self.rx_timestamps, "reply stamps")) if have]
        if not parts:
            return f"the device's own timing ({self.reason})"
        missing = f"; {self.reason}: the device's own timing there" if self.reason else ""
        return f"the kernel's: {', '.join(parts)}{missing}"

    def to_dict(self) -> dict[str, Any]:
        return {"tcp_info": self.tcp_info, "ack_stamps": self.ack_stamps, "rx_timestamps": self.rx_timestamps,
                "reason": self.reason}


STAMP_TRIES = 50  # ~0.5 s of replies, each 10 ms apart, for the first stamped one


def kernel_timing_support() -> KernelTimingSupport:
    """Try each on a connection over this machine's loopback: the kernel that will carry the link."""
    missing = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            with socket.create_connection(server.getsockname(), timeout=2.0) as client:
                peer, _ = server.accept()
                with peer:
                    info = read_tcp_info(client)
                    tcp_info = info is not None and info.bytes_acked is not None
                    if not tcp_info:
                        missing.append("no TCP_INFO" if info is None else "TCP_INFO without tcpi_bytes_acked (Linux < 4.1)")
                    kernel = KernelTiming(client)
                    try:
                        client.sendall(b"x")
                        client.settimeout(2.0)
                        stamps = False
                        # Turning stamps on enables the kernel's receive stamping a moment later (a
                        # deferred static key when no other socket had it on): the first packet may
                        # come unstamped, so a few tries before saying there are none.
                        for _ in range(STAMP_TRIES):
                            peer.sendall(b"y")
                            client.recv(1, socket.MSG_PEEK)
                            stamps = kernel.reply_lag_s() is not None
                            if stamps:
                                break
                            client.recv(1)
                            time.sleep(0.01)
                        acks = False
                        for _ in range(200):  # the ACK of one byte on loopback: at once, or nearly (2 s at most)
                            if kernel.acks():
                                acks = True
                                break
                            time.sleep(0.01)
                    finally:
                        kernel.close()
                    if not acks:
                        missing.append("no ACK stamps (SO_TIMESTAMPING) on TCP")
                    if not stamps:
                        missing.append("no receive stamps (SO_TIMESTAMPNS) on TCP")
    except OSError as exc:
        return KernelTimingSupport(False, False, False, f"a loopback connection failed: {exc}")
    return KernelTimingSupport(tcp_info, acks, stamps, "; ".join(missing) or None)
