"""Which of a bundle's k-bit coded options a calibration offers the table (issue 47).

A coding sends fewer bytes and answers less well; how much less, the build measured
(``split-export build --cut-bits``: top-1 on labelled test data, or agreement with the float
model on held-out images) and recorded beside it. The table weighs time only, so what it may
choose from is settled first, here: a coded option is offered only where its measured answers
clear the user's floor, and one whose answers nothing measured is never offered.
"""

from __future__ import annotations

from dataclasses import dataclass

from device_runtime.bundle import Coding, Manifest, Split


@dataclass(frozen=True)
class AccuracyFloor:
    """What a coded option must have kept of the model's answers, as measured at build. The
    defaults are the issue's bar: at most a point of top-1, or 97 % of answers unchanged."""

    min_agreement: float = 0.97
    max_loss_points: float = 1.0

    def offered(self, manifest: Manifest) -> tuple[list[tuple[Split, Coding]], list[str]]:
        """The coded options that clear the floor, and a line for each that does not, saying why.
        A chain's or a semantic split's codings are none: their hosts run stages or fragments, and
        only a split whose tail a host runs whole is sent coded (its layer split at the same cut is)."""
        offered, left = [], []
        for split in manifest.splits:
            if split.parts:  # a chain's or a semantic split's
                continue
            for coding in split.codings:
                why = self._short(coding, manifest.model.accuracy)
                if why is None:
                    offered.append((split, coding))
                else:
                    left.append(f"codings {split.option(coding)}: left out of the table: {why}")
        return offered, left

    def _short(self, coding: Coding, full: float | None) -> str | None:
        """Why ``coding`` falls short (None: it clears the floor)."""
        if coding.top1 is not None and full is not None:
            loss = (full - coding.top1) * 100.0
            return None if loss <= self.max_loss_points else (
                f"top-1 {coding.top1:.1%} loses {loss:.1f} points of the model's {full:.1%} "
                f"(--max-accuracy-loss {self.max_loss_points:g})")
        if coding.agreement is not None:
            return None if coding.agreement >= self.min_agreement else (
                f"agrees with the float model on {coding.agreement:.1%} of held-out images "
                f"(--min-agreement {self.min_agreement:g})")
        return "nothing measured its answers (rebuild with split-export build --cut-bits, which measures them)"
