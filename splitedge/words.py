"""The two split names every part shares: run everything on the board, or send the input.

They are words of the bundle contract (``device_runtime.bundle`` re-exports them with the
other contract words, and that is where the runtimes import them from) and of the latency
model (DSC Eq. 4-5: l = L and l = 0). ``calibration`` may import nothing of the project but
this bottom package, so they are defined here, once.
"""

from __future__ import annotations

__all__ = ["LOCAL", "OFFLOAD"]

LOCAL = "local"  # l = L: the full model on the board, nothing crosses the link
OFFLOAD = "offload"  # l = 0: the input crosses, the full model runs on the host (DSC Eq. 5)
