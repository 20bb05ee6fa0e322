"""What the stream answers for each frame: its label, where it ran and where the time went.

One :class:`FrameResult` is one line on the console and one record of the trace
(:mod:`device_runtime.stream.trace`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from device_runtime.stream._reason import Reason

__all__ = ["DROP_QUEUE_FULL", "FrameResult", "top1"]

#: Why a frame was dropped, as its result and the trace say (``drop_reason``): the board's queue
#: was full when a newer frame came, and the oldest waiting one made room (newest wins).
DROP_QUEUE_FULL = "queue_full"


@dataclass(frozen=True)
class FrameResult:
    """One frame's outcome: its answer and where the time went (one trace record)."""

    index: int
    name: str
    label: str | None  # None for a dropped frame
    probability: float | None
    split: str  # the split that ran ("local": the full model here; "offload": the full model on the host)
    # Stage times of the batch (DSC Eq. 4's terms, as the model predicts them) ...
    preprocess_ms: float = 0.0
    head_ms: float = 0.0  # the head here (the full model for local)
    transfer_ms: float = 0.0  # the request's round trip less the host's queue and compute
    tail_ms: float = 0.0  # the host's compute for the tail
    # ... and the frame's waits, which the model leaves out: in the board's queue until its head
    # started (batching, the compute thread busy), for a free in-flight slot, in the host's queue.
    queue_ms: float = 0.0
    slot_ms: float = 0.0
    host_queue_ms: float = 0.0
    total_ms: float = 0.0  # capture done → result known
    captured: float = 0.0  # time.monotonic() at capture
    batch: int = 1
    bytes: int = 0  # this frame's share of what crossed the link
    rate_bps: float | None = None  # the link estimate when the split was chosen
    where: str = "local"  # local | remote
    host: str | None = None
    dropped: bool = False  # dropped from the queue by policy: never classified
    drop_reason: str | None = None  # why it was dropped (DROP_QUEUE_FULL, ...); None for an answered frame
    error: str | None = None  # why a remote batch fell back to local
    attempted: str | None = None  # the split chosen for a batch that fell back to local
    missing: tuple[int, ...] = ()  # a semantic split's fragments that did not answer in time (scored absent)
    deadline_ms: float | None = None  # the frame's deadline, capture to answer (None: none)
    reason: Reason | None = None  # why its batch took ``split`` (None for a dropped frame)

    @property
    def late(self) -> bool:
        """Answered after its deadline (a violation, in SplitPlace's terms)."""
        return self.deadline_ms is not None and not self.dropped and self.total_ms > self.deadline_ms

    @property
    def waits_ms(self) -> float:
        """All the frame's queueing: the board's queue, an in-flight slot, the host's queue."""
        return self.queue_ms + self.slot_ms + self.host_queue_ms

    def line(self) -> str:
        if self.dropped:
            return f"#{self.index:<4d} {self.name[:24]:24s} dropped (the pipeline was full; newest frames win)"
        rate = f"  rate {self.rate_bps / 1e6:7.2f} Mbit/s" if self.rate_bps else ""
        notes = ""
        if self.missing:
            notes += f"  (fragments {', '.join(map(str, self.missing))} late: their classes scored absent)"
        if self.reason is not None:  # says a fallback and why, as every other reason
            notes += f"  why: {self.reason.text()}"
        elif self.error:
            notes += "  (fell back to local)"
        return (
            f"#{self.index:<4d} {self.name[:24]:24s} {str(self.label)[:24]:24s} {self.probability:6.3f}  "
            f"split={self.split:<20s} pre {self.preprocess_ms:6.2f} ms  head {self.head_ms:7.2f} ms  transfer {self.transfer_ms:7.2f} ms  "
            f"tail {self.tail_ms:7.2f} ms  waits {self.waits_ms:7.2f} ms  total {self.total_ms:7.2f} ms{rate}{notes}"
        )

    def reason_dict(self) -> dict[str, Any] | None:
        """The reason as JSON (:meth:`Reason.as_dict`); None for a dropped frame."""
        return None if self.reason is None else self.reason.as_dict()


def top1(logits: np.ndarray, labels: Sequence[str]) -> tuple[str, float]:
    """Label and softmax probability of the best class of one (classes,) logit vector."""
    shifted = np.exp(logits - logits.max())
    best = int(shifted.argmax())
    label = labels[best] if best < len(labels) else f"class_{best}"
    return label, float(shifted[best] / shifted.sum())
