"""Dynamic batching on a live host: requests for one tail merge, each gets its own slice, equal
to the tail run on that request alone; other tails and other bundles are never mixed in."""

from __future__ import annotations

import asyncio
import shutil
import signal
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from device_runtime.bundle import Bundle, write_manifest
from host_runtime._batcher import BatchConfig
from tests.conftest import TEST_SPLITS, start_host
from tests.host_runtime.helpers import cut, infer, port_from_log, run_with_client, serve_process, unbatched

EXACT = 1e-5  # a batched run against the same tail run alone
EARLY, LATE = TEST_SPLITS


@pytest.fixture(scope="module")
def bundle(mobilenet_bundle) -> Bundle:
    return Bundle.load(mobilenet_bundle)


def test_concurrent_requests_merge_per_tail_and_get_their_own_slices(mobilenet_bundle, bundle) -> None:
    """Requests of 1, 2, 1, 3 and 1 samples for one split (8: a full batch) and 2 for another,
    all sent at once: the first split runs as one batch of 8, the other as a batch of 2."""
    sizes = [1, 2, 1, 3, 1]
    early = [cut(bundle, EARLY, n, seed=i) for i, n in enumerate(sizes)]
    late = [cut(bundle, LATE, 1, seed=10 + i) for i in range(2)]
    # A generous wait: every request is on the wire long before the first one stops waiting.
    for host in start_host([mobilenet_bundle], batching=BatchConfig(max_batch=8, max_wait_ms=300)):
        replies = run_with_client(host, lambda c: asyncio.gather(
            *(infer(c, bundle.id, EARLY, t) for t in early), *(infer(c, bundle.id, LATE, t) for t in late)
        ))
    early_replies, late_replies = replies[: len(early)], replies[len(early):]
    assert [r["batch"] for r in early_replies] == [8] * len(early)
    assert [r["batch"] for r in late_replies] == [2, 2]
    assert len({r["compute_ms"] for r in early_replies}) == 1  # one run, timed once
    for reply, tensor, alone in zip(early_replies + late_replies, early + late,
                                    unbatched(bundle, EARLY, early) + unbatched(bundle, LATE, late)):
        assert reply["tensor"].shape == (tensor.shape[0], 1000)
        np.testing.assert_allclose(reply["tensor"], alone, atol=EXACT, rtol=0)
        assert reply["queue_ms"] >= 0 and reply["compute_ms"] > 0


def test_batch_never_exceeds_max_batch(mobilenet_bundle, bundle) -> None:
    """Eight single-sample requests with room for three per run: batches of 3, 3 and 2, in order."""
    tensors = [cut(bundle, LATE, 1, seed=i) for i in range(8)]
    for host in start_host([mobilenet_bundle], workers=1, batching=BatchConfig(max_batch=3, max_wait_ms=300)):
        replies = run_with_client(host, lambda c: asyncio.gather(*(infer(c, bundle.id, LATE, t) for t in tensors)))
    assert [r["batch"] for r in replies] == [3, 3, 3, 3, 3, 3, 2, 2]
    for reply, alone in zip(replies, unbatched(bundle, LATE, tensors)):
        np.testing.assert_allclose(reply["tensor"], alone, atol=EXACT, rtol=0)


def test_max_batch_one_turns_batching_off(mobilenet_bundle, bundle) -> None:
    tensors = [cut(bundle, LATE, 1, seed=i) for i in range(4)]
    for host in start_host([mobilenet_bundle], batching=BatchConfig(max_batch=1, max_wait_ms=300)):
        replies = run_with_client(host, lambda c: asyncio.gather(*(infer(c, bundle.id, LATE, t) for t in tensors)))
    assert [r["batch"] for r in replies] == [1, 1, 1, 1]
    assert all(r["queue_ms"] < 300 for r in replies)  # a full batch of one never waits for company


def test_lone_request_waits_for_company_no_longer_than_max_wait(mobilenet_bundle, bundle) -> None:
    for host in start_host([mobilenet_bundle], batching=BatchConfig(max_batch=8, max_wait_ms=150)):
        reply = run_with_client(host, lambda c: infer(c, bundle.id, LATE, cut(bundle, LATE, 1)))
    assert reply["batch"] == 1
    assert 149 <= reply["queue_ms"] < 1000  # waited for company (timers may fire a hair early), then ran alone


@pytest.fixture(scope="module")
def second_bundle(mobilenet_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same network under another bundle id: its artifacts copied (a link leading out of a
    bundle is refused), its manifest re-written by the contract's own writer (which gives it an
    identity of its own)."""
    root = tmp_path_factory.mktemp("second-bundle")
    for entry in Path(mobilenet_bundle).iterdir():
        if entry.is_dir():
            shutil.copytree(entry, root / entry.name)
        elif entry.name != "manifest.json":
            shutil.copy2(entry, root / entry.name)
    manifest = Bundle.load(mobilenet_bundle, roles=()).manifest
    write_manifest(root, replace(manifest, created_by="splitedge (second)"))
    return root


def test_two_bundles_are_served_side_by_side_and_never_batched_together(mobilenet_bundle, second_bundle, bundle) -> None:
    other = Bundle.load(second_bundle).id
    tensors = [cut(bundle, LATE, 1, seed=i) for i in range(4)]
    for host in start_host([mobilenet_bundle, second_bundle], batching=BatchConfig(max_batch=8, max_wait_ms=300)):

        async def session(client):
            replies = await asyncio.gather(*(infer(client, b, LATE, t) for b, t in zip([bundle.id, other] * 2, tensors)))
            return client.server_info, replies, (await client.stats())["stats"]

        hello, replies, stats = run_with_client(host, session)
    assert set(hello["bundles"]) == {bundle.id, other}
    assert [r["batch"] for r in replies] == [2, 2, 2, 2]  # two per bundle, each bundle its own batch
    for reply, alone in zip(replies, unbatched(bundle, LATE, tensors)):
        np.testing.assert_allclose(reply["tensor"], alone, atol=EXACT, rtol=0)
    assert {k: h["count"] for k, h in stats["compute_seconds"].items()} == {f"{bundle.id}/{LATE}": 2, f"{other}/{LATE}": 2}


@pytest.mark.parametrize("wait, share_queue, shares", [("0", "auto", True), ("2", "auto", False), ("2", "on", False),
                                                      ("0", "off", False)])
def test_the_host_says_whether_a_worker_takes_its_share_of_the_queue(
    mobilenet_bundle, tmp_path, wait, share_queue, shares
) -> None:
    """On the CPU, with no wait for company, a worker takes its share of the queue by default, and
    the host says so at start; told to wait, or told not to share, it keeps its batches whole and
    says nothing of shares."""
    log = tmp_path / "host.log"
    process = serve_process(mobilenet_bundle, log, "--device", "cpu", "--max-wait-ms", wait, "--share-queue", share_queue)
    try:
        port_from_log(process, log)
        said = next(line for line in log.read_text().splitlines() if line.startswith("tails run on cpu"))
        assert ("batches of up to 8 samples (a worker takes its share of the queue), not padded" in said) is shares
        assert f"waiting at most {wait} ms" in said
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)


@pytest.mark.parametrize("wrong", ["maybe", "ON", "1", ""])
def test_a_share_queue_that_is_not_auto_on_or_off_is_refused_in_one_line(wrong: str, capsys) -> None:
    from host_runtime.cli import build_parser

    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(["serve", "b/", "--share-queue", wrong])
    assert exit.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument --share-queue: invalid choice: '{wrong}'" in line  # argparse's own line, with the choices:
    assert all(choice in line.partition("choose from")[2] for choice in ("auto", "on", "off"))
