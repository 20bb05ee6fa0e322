"""The host-wide budget for frames still arriving, sans-IO: decoders fed bytes directly."""

from __future__ import annotations

import struct

from device_runtime.wire._framing import FrameBudget, FrameDecoder, Oversized


def started(decoder: FrameDecoder, length: int, have: int = 10) -> list:
    """Feed a length prefix and the first ``have`` bytes of its body."""
    return list(decoder.buffer_updated(_write(decoder, struct.pack(">I", length) + bytes(have))))


def _write(decoder: FrameDecoder, data: bytes) -> int:
    target = decoder.get_buffer()
    target[: len(data)] = data
    return len(data)


def test_a_frame_over_its_share_waits_in_arrival_order_for_bytes_no_one_needs() -> None:
    budget = FrameBudget(1000)
    first, second, third = (FrameDecoder(budget=budget) for _ in range(3))
    woken: list[str] = []
    second.on_granted, third.on_granted = (lambda: woken.append("second")), (lambda: woken.append("third"))
    assert started(first, 400) == [] and first.held == 400 and not first.stalled
    assert started(second, 700) == [] and second.stalled and second.held == 0  # over its share of 500
    assert started(third, 600) == [] and third.stalled  # over its share of 333, behind second
    assert (budget.held, budget.waiting) == (400, 2)
    # first's frame completes: its bytes go to second; third does not fit beside it.
    (body,) = first.buffer_updated(_write(first, bytes(390)))
    assert len(body) == 400 and woken == ["second"] and (budget.held, budget.waiting) == (700, 1)
    assert list(second.buffer_updated(0)) == [] and second.held == 700  # cut again, prefix and all
    (body,) = second.buffer_updated(_write(second, bytes(690)))
    assert len(body) == 700 and bytes(body) == bytes(700) and woken == ["second", "third"]
    third.close()  # a connection gone gives back what it held or was granted
    assert (budget.held, budget.waiting) == (0, 0)


def test_a_frame_within_its_share_never_waits_the_slowest_over_theirs_are_evicted() -> None:
    """Issue 27.2: slow connections holding the budget in large frames are closed for a board's frame."""
    budget = FrameBudget(1000)
    slow, slower, board = (FrameDecoder(budget=budget) for _ in range(3))
    evicted: list[str] = []
    slow.on_evicted, slower.on_evicted = (lambda: evicted.append("slow")), (lambda: evicted.append("slower"))
    started(slow, 500, have=100)
    started(slower, 500, have=10)
    assert budget.held == 1000
    assert started(board, 300) == [] and board.held == 300 and not board.stalled  # share: 333
    assert evicted == ["slower"] and budget.evicted == 1 and budget.held == 800
    assert slower.get_buffer() is not None and list(slower.buffer_updated(10)) == []  # read into nothing
    slower.close()
    assert budget.held == 800


def test_a_limit_changed_on_one_frame_applies_to_the_frames_behind_it_in_the_same_read() -> None:
    """Frames are cut lazily: a handshake frame that lifts the limit lets the large frame
    that arrived with it through (and a frame over the new limit is still refused)."""
    decoder = FrameDecoder(max_frame_bytes=16)
    small, large, huge = bytes(8), bytes(1000), bytes(5000)
    stream = b"".join(struct.pack(">I", len(b)) + b for b in (small, large, huge))
    events = []
    for event in decoder.feed(stream):
        events.append(event)
        decoder.max_frame_bytes = 4096  # the first frame proved the key
    assert [len(e) if isinstance(e, memoryview) else e for e in events] == [8, 1000, Oversized(5000, 4096)]
