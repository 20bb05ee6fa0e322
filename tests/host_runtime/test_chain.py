"""A chain over real hosts on 127.0.0.1: board (head) → host A (stage 1) → host B (stage 2).

The test bundle has MobileNetV2 (real weights) chained through both test cuts. What the board
gets back must be the full model's answer; every hop's times come back with it; a hop that
fails or is not allowed is named, and the board answers such frames itself, losing none.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import numpy as np
import pytest

from device_runtime.bundle import FULL, HEAD, LOCAL, Bundle
from device_runtime.engine._backend import OnnxBackend
from device_runtime.engine._runner import DeviceRunner
from device_runtime.link import Credentials, HostClient, Leg
from device_runtime.hosts._host_link import HostLink
from device_runtime.stream._camera import open_source
from device_runtime.stream._pipeline import Pipeline, PipelineConfig
from device_runtime.stream._policy import StaticPolicy
from device_runtime.wire.ops import Hop
from splitedge.errors import RemoteError
from tests.conftest import TEST_CHAIN, TEST_SPLITS, RunningHost, run_stream, start_host

KEY = b"k" * 32


@pytest.fixture(scope="module")
def bundle(mobilenet_bundle: Path) -> Bundle:
    return Bundle.load(mobilenet_bundle)


@pytest.fixture(scope="module")
def inputs(bundle: Bundle, photos_dir: Path) -> np.ndarray:
    runner = DeviceRunner(bundle, threads=1)
    with open_source(str(photos_dir)) as source:
        return np.concatenate([runner.preprocess(frame.image) for frame in source])


def address(host: RunningHost) -> str:
    return f"{host.host}:{host.port}"


def chain_infer(bundle: Bundle, first: RunningHost, route: tuple[Hop, ...], x: np.ndarray, key: bytes | None = None):
    """The head here, then stage 1 on ``first`` with ``route``: what a board does for one batch."""
    cut = OnnxBackend(bundle.artifact(TEST_CHAIN, HEAD)).run(x)

    async def go():
        client = await HostClient.connect(first.host, first.port, credentials=Credentials(key=key))
        try:
            return await client.infer(bundle.id, TEST_CHAIN, cut, 30.0, leg=Leg(1, tuple(route)))
        finally:
            await client.close()

    return asyncio.run(go())


def full_model(bundle: Bundle, x: np.ndarray) -> np.ndarray:
    return OnnxBackend(bundle.artifact(LOCAL, FULL)).run(x)


def test_a_chain_over_two_hosts_gives_the_full_models_answers(mobilenet_bundle: Path, bundle, inputs) -> None:
    for b in start_host([mobilenet_bundle]):
        for a in start_host([mobilenet_bundle], peers=(address(b),)):
            result = chain_infer(bundle, a, (Hop(address(b), TEST_CHAIN, 2),), inputs)
            b_stats = b.server.stats.as_dict()
    expected = full_model(bundle, inputs)
    np.testing.assert_allclose(result.output, expected, atol=1e-4, rtol=0)
    assert (result.output.argmax(1) == expected.argmax(1)).all()
    (hop,) = result.hops
    assert (hop.address, hop.stage, hop.batch) == (address(b), 2, len(inputs))
    assert hop.compute_ms > 0 and hop.link_ms >= 0 and result.compute_ms > 0
    assert result.transfer_ms <= result.round_trip_ms - result.compute_ms - hop.compute_ms
    assert f"{bundle.id}/{TEST_CHAIN}#2" in b_stats["compute_seconds"]  # stage 2 ran on B


def stopped_mid_stream(mobilenet_bundle: Path, bundle: Bundle, photos_dir: Path, victim: str, frames: int):
    """The photos, looped, along board → A → B, with host ``victim`` ("a" or "b") stopped after 10
    answers: (results, the board's own answer per photo, A's address, B's address)."""
    runner = DeviceRunner(bundle, threads=1)
    local = {r.name: r.label for r in asyncio.run(_stream(runner, photos_dir, None, {}, 4, lambda r: None))}
    for b in start_host([mobilenet_bundle]):
        for a in start_host([mobilenet_bundle], peers=(address(b),)):
            host = {"a": a, "b": b}[victim]
            stopped = []

            def after(results: list) -> None:
                if len(results) == 10 and not stopped:
                    asyncio.run_coroutine_threadsafe(host.server.close(), host.loop).result(10)
                    stopped.append(True)

            results = asyncio.run(_stream(runner, photos_dir, a, {TEST_CHAIN: (address(b),)}, frames, after))
    assert sorted(r.index for r in results) == list(range(frames))  # every frame answered, none twice
    assert all(r.label == local[r.name] for r in results)
    return results, address(a), address(b)


def test_the_board_streams_a_chain_and_loses_no_frame_when_the_last_host_dies(
    mobilenet_bundle: Path, bundle, photos_dir: Path
) -> None:
    """B stopped: the frames it would have served are answered on the board, the hop named."""
    results, a, b = stopped_mid_stream(mobilenet_bundle, bundle, photos_dir, "b", 40)
    remote = [r for r in results if r.where == "remote"]
    fallen = [r for r in results if r.error is not None]
    assert len(remote) >= 10 and all(r.host == f"{a} > {b}" for r in remote)
    assert fallen and all(r.where == "local" and f"stage 2 of {TEST_CHAIN} at {b}" in r.error for r in fallen)


def test_the_board_loses_no_frame_when_the_middle_host_dies(mobilenet_bundle: Path, bundle, photos_dir: Path) -> None:
    """A, the host the board sends to, stopped: the board's connection goes with it, and the frames
    in flight and after are answered on the board."""
    results, _, _ = stopped_mid_stream(mobilenet_bundle, bundle, photos_dir, "a", 30)
    assert sum(r.where == "remote" for r in results) >= 10 and results[-1].where == "local"


async def _stream(runner, photos_dir: Path, host: RunningHost | None, routes: dict, frames: int, after) -> list:
    hosts = None
    if host is not None:
        hosts = HostLink(runner.bundle, address(host))
        assert await hosts.connect(), hosts.last_error
    split = TEST_CHAIN if host is not None else LOCAL
    results = []
    try:
        pipeline = Pipeline(runner, StaticPolicy(split, runner.bundle), hosts, PipelineConfig(routes=routes))
        with open_source(str(photos_dir), loop=True) as source:
            async for result in pipeline.run(source, frames=frames):
                results.append(result)
                after(results)
    finally:
        if hosts is not None:
            await hosts.close()
    return results


def test_a_host_without_a_key_passes_a_chain_on_only_to_its_peers(mobilenet_bundle: Path, bundle, inputs) -> None:
    for b in start_host([mobilenet_bundle]):
        for a in start_host([mobilenet_bundle]):  # no --peer
            with pytest.raises(RemoteError) as info:
                chain_infer(bundle, a, (Hop(address(b), TEST_CHAIN, 2),), inputs[:1])
            assert a.server.stats.as_dict()["compute_seconds"] == {}  # refused before running anything
    assert info.value.code == "unauthorized"
    assert (f"route: next hop {address(b)} is not one of this host's peers (none): a host without a key passes "
            "requests on only to the hosts given with --peer") in info.value.message


def test_a_hop_that_authenticates_refuses_a_host_without_the_key(mobilenet_bundle: Path, bundle, inputs) -> None:
    """B wants the fleet's key; A has none: B refuses A, and the board hears which hop broke."""
    for b in start_host([mobilenet_bundle], key=KEY):
        for a in start_host([mobilenet_bundle], peers=(address(b),)):
            with pytest.raises(RemoteError) as info:
                chain_infer(bundle, a, (Hop(address(b), TEST_CHAIN, 2),), inputs[:1])
    assert info.value.code == "hop_failed"
    assert info.value.message.startswith(f"stage 2 of {TEST_CHAIN} at {address(b)}: host {address(b)} requires "
                                         "authenticated frames")


def test_hosts_with_the_fleets_key_pass_a_chain_on_to_any_host(mobilenet_bundle: Path, bundle, inputs) -> None:
    for b in start_host([mobilenet_bundle], key=KEY):
        for a in start_host([mobilenet_bundle], key=KEY):  # no --peer needed: the request was authenticated
            result = chain_infer(bundle, a, (Hop(address(b), TEST_CHAIN, 2),), inputs[:2], key=KEY)
    np.testing.assert_allclose(result.output, full_model(bundle, inputs[:2]), atol=1e-4, rtol=0)


def test_a_hop_nobody_answers_is_named_and_the_host_serves_on(
    mobilenet_bundle: Path, bundle, inputs, photos_dir: Path
) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{free.getsockname()[1]}"  # bound, never listening: connections are refused
        for a in start_host([mobilenet_bundle], peers=(dead,)):
            with pytest.raises(RemoteError) as info:
                chain_infer(bundle, a, (Hop(dead, TEST_CHAIN, 2),), inputs[:1])
            served = run_stream(DeviceRunner(bundle, threads=1), str(photos_dir), TEST_SPLITS[1], a)
    assert info.value.code == "hop_failed"
    assert info.value.message.startswith(f"stage 2 of {TEST_CHAIN} at {dead}: cannot connect to host {dead}")
    assert [r.where for r in served] == ["remote"] * len(served) and served


def test_a_host_measures_its_links_to_peers_on_demand_and_says_so_in_hello(mobilenet_bundle: Path) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{free.getsockname()[1]}"
        for b in start_host([mobilenet_bundle]):
            stranger = "127.0.0.2:9"  # not a --peer of A's: never dialled
            for a in start_host([mobilenet_bundle], peers=(address(b), dead)):

                async def ask():
                    client = await HostClient.connect(a.host, a.port)
                    try:
                        reply = await client.links([address(b), dead, stranger], payload_bytes=256 * 1024)
                        await client.close()
                        client = await HostClient.connect(a.host, a.port)  # a new hello
                        return reply, client.hello
                    finally:
                        await client.close()

                reply, hello = asyncio.run(ask())
    rate, rtt = reply.links[address(b)]
    assert rate > 1e8 and 0 < rtt < 1000  # loopback: well over 100 Mbit/s
    assert set(reply.failed) == {dead, stranger}
    assert reply.failed[dead].startswith(f"cannot connect to host {dead}")
    assert "is not one of this host's peers" in reply.failed[stranger]
    assert hello.links == {address(b): (rate, rtt)}


def test_a_chain_its_host_refuses_is_left_out_and_no_frame_is_lost(
    mobilenet_bundle: Path, bundle, photos_dir: Path, caplog
) -> None:
    """Host A has no --peer: it refuses the chain's route. The frames sent before the refusal came
    back are answered on the board; after it the chain is no longer a split the board can take (a
    policy that wants it hears so: ``no_host``), said once, instead of a fallback per frame."""
    runner = DeviceRunner(bundle, threads=1)
    for b in start_host([mobilenet_bundle]):
        for a in start_host([mobilenet_bundle]):  # no --peer
            with caplog.at_level("WARNING", logger="splitedge.device"):
                results = asyncio.run(_stream(runner, photos_dir, a, {TEST_CHAIN: (address(b),)}, 24, lambda r: None))
            assert a.server.stats.as_dict()["compute_seconds"] == {}  # refused before running anything
    assert len(results) == 24 and all(r.where == "local" and r.label for r in results)
    fallen = [r for r in results if r.error is not None]
    assert fallen and all("is not one of this host's peers" in r.error for r in fallen)
    after = results[results.index(fallen[-1]) + 1:]
    assert after and all(r.error is None and r.reason.kind == "no_host" and r.reason.wanted == TEST_CHAIN for r in after)
    warned = [m for m in caplog.messages if m.startswith(f"chain {TEST_CHAIN} left out of this run")]
    assert len(warned) == 1 and address(a) in warned[0]
