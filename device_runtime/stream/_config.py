"""How the stream runs: ``split-device run``'s stream flags, as :class:`PipelineConfig`.

Read by the loop (:mod:`device_runtime.stream._pipeline`) and by those it hands heads to: the
connected host's answers (routes, the request timeout), the fragments' (placements) and the prober.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from device_runtime.engine import AUTO
from device_runtime.stream._camera import FrameSource
from device_runtime.stream._pace import BoardPace

__all__ = ["PipelineConfig"]


@dataclass(frozen=True)
class PipelineConfig:
    batch: int = 1  # frames per head run (``--batch``)
    # Frames waiting for the head before the drop policy applies. None: one batch when the
    # newest frames win (a live camera: the head always takes the freshest frames, and a
    # board that only just keeps up cannot carry a standing backlog — with 4 frames queued,
    # ResNet-18 at 5 fps on the emulated board answered 0.9 s late after a link stall, for
    # good), else 4.
    queue: int | None = None
    in_flight: int = 2  # remote batches outstanding: one crosses while the next waits in the socket
    drop: str | None = None  # newest | none; None: newest for a live source, none for a recorded one
    request_timeout_s: float = 5.0  # a host silent this long is gone: the batch runs here instead
    # The host's share of each batch, its queue and tail (ms), sent as the request's deadline: a
    # host that cannot answer in time says ``deadline_exceeded`` (at once, when its queue shows
    # it) and the batch runs here. AUTO: a live source's frame interval (the next frame is due
    # then, and a host slower than that only lets frames pile up); none for a source without one.
    # None: no deadline. A number is above 0: a budget of 0 would be spent before it was sent.
    deadline_ms: float | str | None = AUTO
    probe_every_s: float = 1.0  # probe the link when the rate estimate is older than this
    # A chain's id -> the addresses (host:port) of the hosts of its stages 2..n, in order; the
    # connected host runs stage 1, and () puts every stage on it. A chain runs only with a route.
    routes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # A semantic split's id -> the addresses of the hosts of its fragments 1..K, in order; () puts
    # every fragment on the connected host. A semantic split runs only with an entry here. A
    # fragment whose host goes away is placed again on the others (calibration.place_fragments).
    fragments: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # A trial's stage times to hold the board to (``--pace``: a replay run at the trial's board's
    # speed, :mod:`device_runtime.stream._pace`); None: the board runs at its own.
    pace: BoardPace | None = None

    def __post_init__(self) -> None:
        for name in ("batch", "queue", "in_flight"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        deadline = self.deadline_ms
        if deadline is not None and deadline != AUTO and not (isinstance(deadline, (int, float)) and deadline > 0):
            raise ValueError(f"deadline_ms must be above 0 ms (None: none; AUTO: a live source's frame interval), "
                             f"got {self.deadline_ms!r}")

    def frame_queue(self, live: bool) -> tuple[int, str]:
        """(capacity, drop policy) of the queue before the head, for a live source or a recorded one."""
        drop = self.drop or ("newest" if live else "none")
        capacity = self.queue or (1 if drop == "newest" else 4)
        return max(capacity, self.batch), drop

    def deadline_for(self, source: FrameSource) -> float | None:
        """Each request's deadline (ms) for frames of ``source``; None for none."""
        if self.deadline_ms != AUTO:
            return self.deadline_ms
        interval = source.frame_interval_s if source.live else None
        return None if interval is None else interval * 1000.0
