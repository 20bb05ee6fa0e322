"""The host-wide budget for frames still arriving, sans-IO: decoders fed bytes directly."""

from __future__ import annotations

import struct

from device_runtime.wire.framing import FrameBudget, FrameDecoder, Oversized


def started(decoder: FrameDecoder, length: int, have: int = 10) -> list:
    """Feed a length prefix and the first ``have`` bytes of its body."""
    return list(decoder.buffer_updated(_write(decoder, struct.pack(">I", length) + bytes(have))))


def _write(decoder: FrameDecoder, data: bytes) -> int:
    target = decoder.get_buffer()
    target[: len(data)] = data
    return len(data)


def test_a_frame_that_does_not_fit_stalls_until_bytes_are_released_first_come_first_served() -> None:
    budget = FrameBudget(1000)
    first, second, third = (FrameDecoder(budget=budget) for _ in range(3))
    woken: list[str] = []
    second.on_granted, third.on_granted = (lambda: woken.append("second")), (lambda: woken.append("third"))
    assert started(first, 800) == [] and first.held == 800 and not first.stalled
    assert started(second, 300) == [] and second.stalled and second.held == 0
    assert started(third, 100) == [] and third.stalled  # fits, but second waits ahead of it
    assert (budget.held, budget.waiting) == (800, 2)
    # first's frame completes: its bytes go to second, then third, in that order.
    (body,) = first.buffer_updated(_write(first, bytes(790)))
    assert len(body) == 800 and woken == ["second", "third"] and (budget.held, budget.waiting) == (400, 0)
    assert list(second.buffer_updated(0)) == [] and second.held == 300  # cut again, prefix and all
    (body,) = second.buffer_updated(_write(second, bytes(290)))
    assert len(body) == 300 and bytes(body) == bytes(300)
    third.close()  # a connection gone gives back what it held or was granted
    assert (budget.held, budget.waiting) == (0, 0)


def test_a_closed_waiter_is_no_longer_waited_for() -> None:
    budget = FrameBudget(100)
    holder, waiter = FrameDecoder(budget=budget), FrameDecoder(budget=budget)
    started(holder, 100)
    started(waiter, 50)
    waiter.close()
    holder.close()
    assert (budget.held, budget.waiting) == (0, 0)


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
