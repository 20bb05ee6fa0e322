"""A semantic split over real hosts on 127.0.0.1: the board's head, then its fragments side by side.

The semantic bundle (``tests/conftest.py``) has a Fashion-MNIST model cut at one point twice: a
layer split, and a semantic split of 3 fragments. What the board merges must be the fragments'
logits in label order; a fragment late for the deadline is answered without, its classes scored
absent; a fragment host that dies costs no frame; and the bandit chooses per batch between the
layer split and the semantic split, learning from every answer.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest

from calibration.bandit import Bandit, LAYER, SEMANTIC
from device_runtime.bundle import HEAD, Bundle
from device_runtime.engine._backend import OnnxBackend
from device_runtime.engine._runner import DeviceRunner
from device_runtime.hosts._host_link import HostLink
from device_runtime.link import ClientPool
from device_runtime.stream._camera import Frame, FrameSource, open_source
from device_runtime.stream._fragments import FragmentRequest, merge
from device_runtime.stream._pipeline import Pipeline, PipelineConfig
from device_runtime.stream._policy import BanditPolicy, StaticPolicy
from device_runtime.stream._reason import BANDIT, FIXED
from splitedge.errors import HostUnavailableError
from tests.conftest import SEMANTIC_CUT, SEMANTIC_SPLIT, RunningHost, start_host
from tests.host_runtime.helpers import Held

TOLERANCE = 1e-5  # the same ONNX files on the same onnxruntime, batched or not


@pytest.fixture(scope="module")
def bundle(semantic_bundle: Path) -> Bundle:
    return Bundle.load(semantic_bundle)


@pytest.fixture(scope="module")
def cut(bundle: Bundle, photos_dir: Path) -> np.ndarray:
    """The photos through the semantic split's head: what a board sends its fragments."""
    runner = DeviceRunner(bundle, threads=1)
    with open_source(str(photos_dir)) as source:
        x = np.concatenate([runner.preprocess(frame.image) for frame in source])
    return OnnxBackend(bundle.artifact(SEMANTIC_SPLIT, HEAD)).run(x)


def address(host: RunningHost) -> str:
    return f"{host.host}:{host.port}"


def reference(bundle: Bundle, cut: np.ndarray) -> dict[int, np.ndarray]:
    """Each fragment run here on the cut, from the bundle's own files."""
    split = bundle.manifest.split(SEMANTIC_SPLIT)
    return {f.index: OnnxBackend(bundle.stage_artifact(split.id, f.index)).run(cut) for f in split.fragments}


def gathered(bundle: Bundle, placement: dict[int, str], cut: np.ndarray, wait_s: float = 30.0):
    async def go():
        pool = ClientPool()
        try:
            request = FragmentRequest(bundle.id, bundle.manifest.split(SEMANTIC_SPLIT), len(bundle.manifest.model.labels),
                                      cut, 30.0)
            return await request.gather(pool, placement, wait_s)
        finally:
            await pool.close()

    return asyncio.run(go())


def test_the_bundle_has_both_splits_at_one_cut(bundle: Bundle) -> None:
    layer, semantic = bundle.manifest.split(SEMANTIC_CUT), bundle.manifest.split(SEMANTIC_SPLIT)
    assert layer.tensor == semantic.tensor and len(semantic.fragments) == 3
    assert sorted(c for f in semantic.fragments for c in f.classes) == list(range(10))
    assert set(semantic.accuracies) == {"full", "layer", "semantic"}


def test_fragments_on_two_hosts_merge_into_label_order(semantic_bundle: Path, bundle: Bundle, cut: np.ndarray) -> None:
    for a in start_host([semantic_bundle]):
        for b in start_host([semantic_bundle]):
            result = gathered(bundle, {1: address(a), 2: address(b), 3: address(a)}, cut)
    outputs = reference(bundle, cut)
    split = bundle.manifest.split(SEMANTIC_SPLIT)
    assert result.missing == () and result.failures == {}
    assert {(t.index, t.address) for t in result.timings} == {(1, address(a)), (2, address(b)), (3, address(a))}
    np.testing.assert_allclose(result.logits, merge(split, 10, outputs, len(cut)), atol=TOLERANCE, rtol=0)
    for fragment in split.fragments:  # each group's columns are that fragment's output, in its order
        np.testing.assert_allclose(result.logits[:, list(fragment.classes)], outputs[fragment.index], atol=TOLERANCE)


def test_a_late_fragment_is_answered_without_its_classes(semantic_bundle: Path, bundle: Bundle, cut: np.ndarray) -> None:
    split = bundle.manifest.split(SEMANTIC_SPLIT)
    for a in start_host([semantic_bundle]):
        key = (bundle.id, f"{SEMANTIC_SPLIT}#2")
        held = a.server.registry.tails[key] = Held(a.server.registry.tails[key])
        try:
            result = gathered(bundle, {1: address(a), 2: address(a), 3: address(a)}, cut, wait_s=1.0)
        finally:
            held.go.set()
    assert held.started.is_set() and result.missing == (2,) and result.failures == {}
    late = list(split.fragments[1].classes)
    assert np.isneginf(result.logits[:, late]).all()
    outputs = reference(bundle, cut)
    np.testing.assert_allclose(result.logits, merge(split, 10, {1: outputs[1], 3: outputs[3]}, len(cut)), atol=TOLERANCE)


def test_no_fragment_answering_is_one_error_naming_each(bundle: Bundle, cut: np.ndarray) -> None:
    with pytest.raises(HostUnavailableError, match=r"semantic split _14~3: no fragment answered \(fragment 1: "
                                                    r"127\.0\.0\.1:1: .*fragment 2: 127\.0\.0\.1:1: "):
        gathered(bundle, {1: "127.0.0.1:1", 2: "127.0.0.1:1", 3: "127.0.0.1:1"}, cut)


async def _stream(runner: DeviceRunner, source, connected: RunningHost, placed: tuple[str, ...], policy, after) -> list:
    hosts = HostLink(runner.bundle, address(connected))
    assert await hosts.connect(), hosts.last_error
    results = []
    try:
        config = PipelineConfig(fragments={SEMANTIC_SPLIT: placed}, request_timeout_s=10.0, drop="none")
        async for result in Pipeline(runner, policy, hosts, config).run(source):
            results.append(result)
            after(results)
    finally:
        await hosts.close()
    return results


def test_a_fragment_host_dying_mid_stream_costs_no_frame(semantic_bundle: Path, bundle: Bundle, photos_dir: Path) -> None:
    """Fragments 1 and 3 on A (the host the board sends to), 2 on B; B stopped after 8 answers:
    the frames in flight then are answered from A's fragments, B's group scored absent; fragment 2
    moves to A, which serves it too, and the later frames are whole again. None is lost."""
    runner = DeviceRunner(bundle, threads=1)
    frames = 30
    for a in start_host([semantic_bundle]):
        for b in start_host([semantic_bundle]):
            stopped = []

            def after(results: list) -> None:
                if len(results) == 8 and not stopped:
                    asyncio.run_coroutine_threadsafe(b.server.close(), b.loop).result(10)
                    stopped.append(len(results))

            with open_source(str(photos_dir), loop=True) as source:
                source = _limited(source, frames)
                results = asyncio.run(_stream(runner, source, a, (address(a), address(b), address(a)),
                                              StaticPolicy(SEMANTIC_SPLIT, bundle), after))
    assert sorted(r.index for r in results) == list(range(frames))  # every frame answered, none twice
    before, later = results[:8], results[12:]
    assert all(r.split == SEMANTIC_SPLIT and r.missing == () and r.host == f"{address(a)} | {address(b)}"
               for r in before)
    assert all(r.split == SEMANTIC_SPLIT and r.missing in ((), (2,)) for r in results[8:12])  # in flight as B went
    assert later and all(r.split == SEMANTIC_SPLIT and r.missing == () and r.host == address(a) for r in later)


def test_the_bandit_chooses_per_batch_and_learns_from_every_answer(
    semantic_bundle: Path, bundle: Bundle, photos_dir: Path
) -> None:
    """Learning (ε = 1 at first: a coin per batch), every frame with a deadline: both arms run,
    each answer is an observation of the arm that produced it, in the context of its deadline."""
    runner = DeviceRunner(bundle, threads=1)
    bandit = Bandit(random.Random(0))
    policy = BanditPolicy(StaticPolicy(SEMANTIC_CUT, bundle), bundle, SEMANTIC_SPLIT, bandit)
    frames = 40
    for a in start_host([semantic_bundle]):
        with open_source(str(photos_dir), loop=True) as source:
            results = asyncio.run(_stream(runner, _limited(source, frames, deadline_ms=500.0), a, (), policy,
                                          lambda r: None))
    assert sorted(r.index for r in results) == list(range(frames))
    by_arm = {arm: [r for r in results if (r.split == SEMANTIC_SPLIT) == (arm == SEMANTIC)] for arm in (LAYER, SEMANTIC)}
    assert len(by_arm[LAYER]) >= 5 and len(by_arm[SEMANTIC]) >= 5  # a fair coin, seeded
    assert all(r.split == SEMANTIC_CUT for r in by_arm[LAYER]) and all(r.deadline_ms == 500.0 for r in results)
    observed = {arm: sum(bandit.stats(ctx, arm).count for ctx in ("low", "high")) for arm in (LAYER, SEMANTIC)}
    assert observed == {arm: len(rs) for arm, rs in by_arm.items()}
    assert bandit.layer_ms is not None  # R (the layer arm's response estimate) follows the layer answers
    # Each answer says which arm the bandit took, with what it knew of it (a remote answer: no fallback).
    remote = [r for r in results if r.where == "remote"]
    assert all((r.reason.kind, r.reason.arm) == (BANDIT, SEMANTIC) for r in remote if r.split == SEMANTIC_SPLIT)
    assert all((r.reason.kind, r.reason.arm) == (FIXED, LAYER) for r in remote if r.split == SEMANTIC_CUT)
    assert all(0.0 <= r.reason.score <= 1.0 for r in remote)


def _limited(source: FrameSource, frames: int, deadline_ms: float | None = None) -> FrameSource:
    """The first ``frames`` frames of ``source``, each with ``deadline_ms`` (the application's)."""

    class Limited(FrameSource):
        live, frame_interval_s, description = source.live, source.frame_interval_s, source.description

        def __iter__(self):
            for _, frame in zip(range(frames), source):
                yield Frame(frame.index, frame.name, frame.image, frame.captured, deadline_ms)

    return Limited()


def test_plan_shows_what_the_bandit_learned(semantic_bundle: Path, tmp_path: Path, capsys) -> None:
    """bandit.json beside the bundle, no calibration yet: plan shows the bandit's state per context,
    then says what to run for the table."""
    import shutil

    from device_runtime.cli import main

    copy = tmp_path / "bundle"
    shutil.copytree(semantic_bundle, copy)
    bandit = Bandit(random.Random(0))
    bandit.observe(LAYER, 50.0, 60.0, 0.91)
    bandit.observe(SEMANTIC, 50.0, 30.0, 0.89)
    bandit.save(copy)
    assert main(["plan", str(copy)]) != 0
    out, err = capsys.readouterr()
    assert "split choice (SplitPlace bandit): mode learn" in out
    assert "low  (deadline < estimate): layer n=0 mean 0.000  semantic n=1 mean 0.500  -> semantic" in out
    assert "no calibration for this bundle" in err
