"""``split-device calibrate`` against a slow host (issue 43): its profile requests fit the budget the
host's ``hello`` announces, and what one run cannot time within it is left out in one line while
the calibration completes with the rest."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from calibration.calibration_file import load
from device_runtime.board._calibrate import Rounds, profile_host
from device_runtime.bundle import OFFLOAD, Bundle
from device_runtime.cli import main
from device_runtime.wire.ops import HelloReply
from host_runtime._profiling import PLANNED_SHARE
from splitedge.errors import RemoteError
from tests.conftest import TEST_CHAIN, TEST_SPLITS, start_host
from tests.device_runtime.board.test_calibrate import Slow


class BudgetedHost:
    """A host client's stand-in whose one tail costs ``ms_per_sample`` of the host's time a sample,
    and whose ``profile`` keeps a real host's rules (:func:`host_runtime._profiling.run_profile`):
    a request whose one run of each batch size is over ``budget_ms`` is ``bad_request``; otherwise
    its repeats are trimmed, unseen, to what PLANNED_SHARE of the budget holds after a warm-up run.
    ``announce``: whether its hello says its budget (a host from before it did not)."""

    def __init__(self, budget_ms: float, ms_per_sample: float, announce: bool = True) -> None:
        self.budget_ms, self.ms_per_sample = budget_ms, ms_per_sample
        self.hello = HelloReply(1, 1, {"b": ["s"]}, False, 1 << 20, "cpu", {}, budget_ms if announce else None)
        self.asked: list[tuple[tuple[int, ...], int, int]] = []  # (batch sizes, repeats asked, repeats run)

    async def profile(self, bundle_id, batches, repeats, splits):
        one_round = sum(self.ms_per_sample * b for b in batches)
        rounds = int(PLANNED_SHARE * self.budget_ms / one_round) or int(self.budget_ms / one_round)
        ran = min(repeats, rounds - (1 if rounds > 1 else 0))
        self.asked.append((tuple(batches), repeats, ran))
        if ran < 1:
            raise RemoteError("bad_request", f"profile: one run of each batch size would take about {one_round:.0f} ms "
                              f"of this host's time, over its budget of {self.budget_ms:g} ms a request "
                              "(--profile-budget-ms); ask for fewer splits or smaller batches per request")
        return {splits[0]: {b: self.ms_per_sample * b for b in batches}}

    def runs(self) -> dict[int, int]:
        """Timed runs the host made at each batch size, all requests together."""
        runs: dict[int, int] = {}
        for sizes, _, ran in self.asked:
            for b in sizes:
                runs[b] = runs.get(b, 0) + max(ran, 0)
        return runs


def profiled(host: BudgetedHost, batches: tuple[int, ...], repeats: int) -> tuple[dict, list[str]]:
    lines: list[str] = []
    return asyncio.run(profile_host(host, "b", Rounds(batches, repeats, lines.append))), lines


def test_a_slow_tail_is_timed_in_requests_within_the_budget_and_what_cannot_be_is_left_out_in_one_line() -> None:
    """30 ms a sample, 100 ms a request: batch 1 and 2 fit one run a request (a warm-up besides, at
    batch 1), batch 4 (120 ms) none. Every repeat is timed, in requests the host runs as asked."""
    host = BudgetedHost(100, 30)
    tails, lines = profiled(host, (1, 2, 4), 5)
    assert tails == {"s": {1: 30.0, 2: 60.0}}
    assert host.runs()[1] >= 5 and host.runs()[2] >= 5
    # nothing is known of the tail before its first reply; after it, no request is trimmed unseen
    first = next(i for i, (_, _, ran) in enumerate(host.asked) if ran > 0)
    assert all(ran == asked for sizes, asked, ran in host.asked[first + 1:] if sizes != (4,)), host.asked
    left_out = [line for line in lines if "not timed" in line]
    assert len(left_out) == 1, lines
    assert ("s: not timed at B=4: one run is over what one profile request may cost the host (its budget of 100 ms; "
            "about 120 ms at B=4); the table extrapolates them from B=1,2: to time them, ask the host's operator "
            "for --profile-budget-ms 350") in left_out[0]
    # the budget the line asks for times it
    tails, lines = profiled(BudgetedHost(350, 30), (1, 2, 4), 5)
    assert set(tails["s"]) == {1, 2, 4} and not [line for line in lines if "not timed" in line]


def test_sizes_whose_repeats_fit_share_a_request_and_the_rest_go_alone_with_what_fits() -> None:
    host = BudgetedHost(100, 2)
    tails, lines = profiled(host, (1, 2, 4, 8), 20)
    assert tails == {"s": {1: 2.0, 2: 4.0, 4: 8.0, 8: 16.0}} and not [line for line in lines if "not timed" in line]
    assert all(runs >= 20 for runs in host.runs().values()), host.asked
    assert all(ran == asked for _, asked, ran in host.asked[1:]), host.asked
    assert len(host.asked) < 20  # not a warm-up and one run of every size, twenty times over


def test_a_host_that_does_not_announce_its_budget_is_asked_as_before_and_still_leaves_out_what_it_refuses() -> None:
    host = BudgetedHost(100, 30, announce=False)
    tails, lines = profiled(host, (1, 2, 4), 5)
    assert tails == {"s": {1: 30.0, 2: 60.0}}
    assert [sizes for sizes, _, _ in host.asked] == [(1, 2, 4), (1,), (2,), (4,)]
    left_out = [line for line in lines if "not timed" in line]
    assert len(left_out) == 1 and "s: not timed at B=4: " in left_out[0] and "--profile-budget-ms" in left_out[0]


def test_a_tail_the_host_cannot_run_once_is_no_option() -> None:
    tails, lines = profiled(BudgetedHost(100, 150), (1, 2), 5)
    assert tails == {}
    assert [line for line in lines if "not timed" in line] == [
        "host   s: not timed at B=1,2: one run is over what one profile request may cost the host (its budget of "
        "100 ms); left out of the table: to offer it, ask the host's operator for a larger --profile-budget-ms (the "
        "host said: profile: one run of each batch size would take about 150 ms of this host's time, over its budget "
        "of 100 ms a request (--profile-budget-ms); ask for fewer splits or smaller batches per request)"
    ]


BUDGET_S = 0.4


def test_calibrate_against_a_real_host_with_a_small_budget_completes_and_says_what_it_left_out(
    mobilenet_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A real host on 127.0.0.1 whose budget (400 ms a request) times one cut at batch 1 only (240 ms
    of CPU a sample more, spun on the profiler's thread: the host counts its process's CPU, which a
    busy machine does not shrink) and the other cut at no batch size (600 ms a sample). Calibration
    completes: the first cut's tail is extrapolated at batch 2, the second is no option."""
    root = tmp_path / "bundle"
    shutil.copytree(mobilenet_bundle, root)
    bundle_id = Bundle.load(root, roles=()).id
    partly, never = TEST_SPLITS[1], TEST_SPLITS[0]
    for host in start_host([root], profile_budget_s=BUDGET_S, profile_rate=10.0):
        tails = host.server.registry.tails
        tails[bundle_id, partly] = Slow(tails[bundle_id, partly], 0.6 * BUDGET_S, per_sample=True)
        tails[bundle_id, never] = Slow(tails[bundle_id, never], 1.5 * BUDGET_S, per_sample=True)
        assert main(["calibrate", str(root), "--host", f"{host.host}:{host.port}", "--batch", "1,2",
                     "--repeats", "3", "--threads", "1"]) == 0
    out = capsys.readouterr()
    lines = (out.out + out.err).splitlines()
    left_out = [line for line in lines if ": not timed at B=" in line]
    assert len(left_out) == 2, lines
    partly_line, never_line = (next(line for line in left_out if f"{split}: not timed" in line) for split in (partly, never))
    assert f"{partly}: not timed at B=2: " in partly_line and "its budget of 400 ms" in partly_line
    assert "the table extrapolates them from B=1: to time them, ask the host's operator for --profile-budget-ms " in partly_line
    assert f"{never}: not timed at B=1,2: " in never_line and "its budget of 400 ms" in never_line
    assert "left out of the table" in never_line and "--profile-budget-ms" in never_line
    model = load(root).model
    assert never not in model.names and {partly, OFFLOAD, TEST_CHAIN} <= set(model.names)
    partly_tail = model.timings(partly)
    assert set(partly_tail.tail_ms) == {1} and partly_tail.tail_ms[1] >= 0.6 * BUDGET_S * 1000
    assert partly_tail.tail_at(2) >= partly_tail.tail_ms[1]  # priced at batch 2 too, from batch 1
