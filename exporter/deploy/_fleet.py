"""A fleet in rolling batches: slice once, deploy to ``serial`` boards at a time, stop when too many fail.

The batches follow Ansible's ``serial`` and ``max_fail_percentage``: boards of a batch deploy
in parallel; after each batch, when the boards failed so far are more than ``max_fail`` of the
fleet, the boards not yet reached are left alone (their ``current`` untouched) and the deploy
stops. Each failed board has already been put back on its previous release by its own steps.
"""

from __future__ import annotations

import shlex
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from device_runtime import slice_bundle
from device_runtime.bundle import BOARD_PART
from exporter.deploy._remote_board import (
    NO_SUDO, BoardResult, Release, ServiceOptions, deploy_board, elevation, probe, rollback_board,
)
from exporter.deploy._remote import Remote
from splitedge import SplitEdgeError
from splitedge.errors import DeployError

__all__ = ["Fleet", "FleetPlan", "FleetResult", "parse_max_fail"]


def parse_max_fail(text: str) -> float:
    """``25%`` or ``0.25`` -> 0.25: the share of the fleet that may fail before the rest is left alone."""
    value = text.strip()
    try:
        share = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise SplitEdgeError(f"--max-fail {text!r}: expected a percentage such as 25% (or a share such as 0.25)") \
            from None
    if not 0 <= share <= 1:
        raise SplitEdgeError(f"--max-fail {text!r}: must lie between 0% and 100%")
    return share


@dataclass
class FleetResult:
    boards: list[BoardResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # not reached: the deploy stopped before them
    stopped: str | None = None

    @property
    def ok(self) -> bool:
        return not self.skipped and all(b.ok for b in self.boards)


@dataclass
class FleetPlan:
    """What a deploy would do (``--dry-run``): the lines it prints, and the boards it would fail on,
    each with the one-line reason its line says (unreachable, nothing to run a release, no way to
    install the service)."""

    steps: list[str] = field(default_factory=list)
    would_fail: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.would_fail


@dataclass
class Fleet:
    """The boards of one deploy and how to reach them."""

    destinations: Sequence[str]
    ssh_config: Path | None = None
    ssh_options: Sequence[str] = ()
    connect_timeout_s: int = 10
    say: Callable[[str], None] = print

    def __post_init__(self) -> None:
        if not self.destinations:
            raise SplitEdgeError("no boards: give --to USER@BOARD (repeatable)")
        if len(set(self.destinations)) != len(self.destinations):
            raise SplitEdgeError("a board is named twice in --to")
        self._control = tempfile.TemporaryDirectory(prefix="splitedge-ssh-")

    def remote(self, destination: str) -> Remote:
        return Remote(destination, Path(self._control.name), self.ssh_config, self.ssh_options,
                      self.connect_timeout_s)

    def close(self) -> None:
        for destination in self.destinations:
            self.remote(destination).close()
        self._control.cleanup()

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _in_batches(self, work: Callable[[str], BoardResult], serial: int | None, max_fail: float) -> FleetResult:
        size = len(self.destinations) if not serial else max(1, serial)
        result = FleetResult()
        for start in range(0, len(self.destinations), size):
            batch = self.destinations[start:start + size]
            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                for board in pool.map(work, batch):
                    result.boards.append(board)
                    self.say(board.line())
            failed = sum(not b.ok for b in result.boards)
            rest = list(self.destinations[start + size:])
            if rest and failed / len(self.destinations) > max_fail:
                result.skipped = rest
                result.stopped = (f"stopped: {failed} of {len(self.destinations)} boards failed "
                                  f"({100 * failed / len(self.destinations):.0f}% > --max-fail "
                                  f"{100 * max_fail:g}%); not reached: {', '.join(rest)}")
                self.say(result.stopped)
                break
        return result

    def deploy(self, bundle: Path, *, formats: Sequence[str] | None = None, precision: str | None = None,
               settings: Mapping[str, str] | None = None, keep: int = 3, serial: int | None = None,
               max_fail: float = 0.0, service: ServiceOptions | None = None) -> FleetResult:
        """Slice ``bundle`` for a board once, then deploy it to every board, batch by batch."""
        with tempfile.TemporaryDirectory(prefix="splitedge-deploy-") as work:
            release = self.slice(bundle, Path(work), formats, precision)
            self.say(f"deploying {release.id} ({release.bytes / 1e6:.1f} MB, a board slice of "
                     f"{release.manifest.wire_id}) to {len(self.destinations)} board(s)")
            return self._in_batches(lambda d: deploy_board(self.remote(d), release, settings or {}, keep, service),
                                    serial, max_fail)

    def rollback(self, serial: int | None = None, max_fail: float = 0.0) -> FleetResult:
        return self._in_batches(lambda d: rollback_board(self.remote(d)), serial, max_fail)

    def slice(self, bundle: Path, work: Path, formats: Sequence[str] | None, precision: str | None) -> Release:
        sliced = slice_bundle(bundle, work / "board", BOARD_PART, formats=formats, precision=precision)
        for note in sliced.notes:
            self.say(f"note: {note}")
        return Release(sliced.out, sliced.manifest, sliced.bytes)

    def plan(self, bundle: Path, *, formats: Sequence[str] | None = None, precision: str | None = None,
             settings: Mapping[str, str] | None = None, keep: int = 3, serial: int | None = None,
             max_fail: float = 0.0, service: ServiceOptions | None = None) -> FleetPlan:
        """What :meth:`deploy` would do, board by board, after read-only probes, and which boards it
        would fail on; changes nothing."""
        plan = FleetPlan()
        lines = plan.steps
        with tempfile.TemporaryDirectory(prefix="splitedge-deploy-") as work:
            release = self.slice(bundle, Path(work), formats, precision)
            lines.append(f"would deploy {release.id} ({release.bytes / 1e6:.1f} MB, {len(release.manifest.splits)} "
                         f"split(s)) to {len(self.destinations)} board(s), {serial or 'all'} at a time, stopping "
                         f"when over {100 * max_fail:g}% fail")
            for destination in self.destinations:
                try:
                    facts = probe(self.remote(destination))
                except DeployError as exc:
                    plan.would_fail[destination] = exc.reason
                    lines.append(f"{destination}: cannot deploy: {exc.reason}")
                    continue
                elevate = elevation(facts)
                if service is not None and elevate is None:
                    plan.would_fail[destination] = NO_SUDO
                    lines.append(f"{destination}: cannot deploy: {NO_SUDO}")
                    continue
                sd = shlex.quote(facts.split_device)
                how = f"rsync, hard-linking what {facts.current} has" if facts.rsync and facts.current else \
                    ("rsync" if facts.rsync else "tar over ssh (no rsync on the board)")
                lines.append(f"{destination}: current {facts.current or 'none'}, "
                             f"{facts.free_bytes / 1e6:.0f} MB free under {facts.root}")
                incoming, target = facts.layout.incoming(release.id), facts.layout.release(release.id)
                lines.append(f"  upload to {incoming}/ by {how}")
                lines.append(f"  {sd} verify {incoming} --json")
                lines.append(f"  mv -T {incoming} {target}")
                lines.append(f"  {sd} switch {release.id} --root {facts.root} --keep {keep}")
                if settings:
                    sets = " ".join(f"--set {shlex.quote(f'{k}={v}')}" for k, v in settings.items())
                    lines.append(f"  {sd} config {sets} --file {facts.config}")
                if service is not None:
                    lines.append(f"  {elevate}{sd} install-service --root {facts.root} --user {facts.user}   "
                                 "# restarts it; returns once it answers a frame")
                    lines.append(f"  watch split-device status: the service active for {service.health_s:g} s")
        return plan
