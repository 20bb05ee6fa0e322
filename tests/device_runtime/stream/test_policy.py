"""Split policies: fixed splits fall back to local without a host; auto refines its table with measured times."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from calibration import Calibration, LatencyModel, SplitTable, SplitTimings
from device_runtime.bundle import LOCAL, OFFLOAD
from device_runtime.stream.policy import AutoPolicy, StaticPolicy
from splitedge.errors import BundleError

CUT = "cut"


class _Manifest:
    def split(self, split_id: str):
        if split_id != CUT:
            raise BundleError(f"unknown split {split_id!r}")


class _Bundle:
    manifest = _Manifest()


def _calibration(local_ms: float) -> Calibration:
    model = LatencyModel((SplitTimings(LOCAL, 0, {1: local_ms}, {}), SplitTimings(CUT, 10_000, {1: 5.0}, {1: 5.0})), 0.0)
    return Calibration(
        bundle_id="b", manifest_sha256="0" * 64, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        board={}, backend="onnx", precision="float32", threads=1, repeats=1, batches=(1,), link=None, model=model,
        table=SplitTable.build(model, (1,)),
    )


def test_static_policy_runs_local_while_no_host_has_its_split() -> None:
    policy = StaticPolicy(CUT, _Bundle())
    assert policy.choose(1, 1e7, {LOCAL, CUT}) == CUT
    assert policy.choose(1, 1e7, {LOCAL}) == LOCAL
    assert StaticPolicy(OFFLOAD, _Bundle()).split == OFFLOAD  # not a split of the bundle, still an option
    with pytest.raises(BundleError, match="unknown split 'nope'"):
        StaticPolicy("nope", _Bundle())


def test_auto_policy_refines_the_table_with_the_times_it_measures() -> None:
    """Calibrated local at 200 ms, CUT wins at 100 Mbit/s (10.8 ms); the board then measures
    local at 8 ms: after refine_every observations the table says local."""
    policy = AutoPolicy(_calibration(200.0), min_hold=1, refine_every=16)
    everything = {LOCAL, CUT}
    assert policy.choose(1, 1e8, everything) == CUT
    for _ in range(16):
        policy.observe_head(LOCAL, 1, 8.0)
    assert policy.choose(1, 1e8, everything) == LOCAL
    assert policy.switches == 1


def test_auto_policy_without_a_host_runs_local_at_once() -> None:
    policy = AutoPolicy(_calibration(200.0), min_hold=5)
    assert policy.choose(1, 1e8, {LOCAL, CUT}) == CUT
    assert policy.choose(1, 1e8, {LOCAL}) == LOCAL  # forced: no hysteresis when the split cannot run
