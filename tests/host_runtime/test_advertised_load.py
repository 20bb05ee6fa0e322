"""Discovery for fleets: the TXT record's ``load`` follows the host's real load (zeroconf on
127.0.0.1 only), so a device browsing two hosts is offered the idle one first."""

from __future__ import annotations

import asyncio

import pytest

from device_runtime.bundle import Bundle
from device_runtime.link import HostClient
from device_runtime.hosts._discovery import HostAdvert, discover
from host_runtime._advertise import Advertiser
from host_runtime._batcher import BatchConfig, LoadMeter
from tests.conftest import TEST_SPLITS, RunningHost, start_host
from tests.host_runtime.helpers import Held, cut

LOOPBACK = ["127.0.0.1"]
REFRESH_S = 0.25  # the CLI refreshes every second; a test need not wait that long


def test_load_meter_is_a_time_weighted_mean_between_reads() -> None:
    now = [0.0]
    meter = LoadMeter(clock=lambda: now[0])
    meter.set(4)
    now[0] = 1.0
    meter.set(0)
    now[0] = 4.0
    assert meter.read() == pytest.approx(1.0)  # 4 samples for 1 s of 4
    meter.set(2)
    now[0] = 6.0
    assert meter.read() == pytest.approx(2.0)  # the window restarted at the last read
    assert meter.read() == 2.0  # no time passed: the level itself


def advertise(host: RunningHost, name: str, bundle_id: str) -> Advertiser:
    """Register ``host`` on loopback from its own loop, its load read from its server."""
    return Advertiser("127.0.0.1", host.port, [bundle_id], LOOPBACK, name=name, load=host.server.load, refresh_s=REFRESH_S)


def test_loaded_host_advertises_more_load_than_an_idle_one(mobilenet_bundle) -> None:
    """Eight requests wait on a host whose one worker is held (no CPU burnt: a real flood on two
    cores once starved the other host's zeroconf responder out of the browse)."""
    bundle = Bundle.load(mobilenet_bundle)
    split = TEST_SPLITS[0]
    tensor = cut(bundle, split, 1)
    config = {"workers": 1, "batching": BatchConfig(max_batch=1)}
    busy_gen, idle_gen = start_host([mobilenet_bundle], **config), start_host([mobilenet_bundle], **config)
    busy, idle = next(busy_gen), next(idle_gen)
    held = busy.server.registry.tails[bundle.id, split] = Held(busy.server.registry.tails[bundle.id, split])
    adverts = {host.port: advertise(host, name, bundle.id) for host, name in ((busy, "test-busy"), (idle, "test-idle"))}
    entering = [asyncio.run_coroutine_threadsafe(adverts[h.port].__aenter__(), h.loop) for h in (busy, idle)]
    try:
        for future in entering:
            future.result(10)  # both register at once: ~1.7 s together

        async def flood_and_look():
            client = await HostClient.connect(busy.host, busy.port)
            stop = asyncio.Event()

            async def keep_busy():  # eight requests in flight on a host with one worker
                while not stop.is_set():
                    await client.infer(bundle.id, split, tensor)

            workers = [asyncio.ensure_future(keep_busy()) for _ in range(8)]
            try:
                await asyncio.sleep(3 * REFRESH_S)  # a full refresh window of load has been published
                # discover returns half a second after the first host it resolves: on a busy machine
                # the other may take longer, so browse again (bounded) until both have been heard.
                heard: dict[int, HostAdvert] = {}
                for _ in range(5):
                    heard |= {advert.port: advert for advert in await discover(bundle.id, LOOPBACK, timeout=3)}
                    if len(heard) == 2:
                        break
                return sorted(heard.values(), key=lambda a: (a.load, a.name))
            finally:
                stop.set()
                held.go.set()
                await asyncio.gather(*workers)
                await client.close()

        found = asyncio.run(flood_and_look())
    finally:
        held.go.set()
        for host in (busy, idle):
            asyncio.run_coroutine_threadsafe(adverts[host.port].__aexit__(None, None, None), host.loop).result(10)
        for gen in (busy_gen, idle_gen):
            gen.close()
    loads = {advert.port: advert.load for advert in found}
    assert set(loads) == {busy.port, idle.port}
    assert loads[idle.port] == 0.0
    assert loads[busy.port] > 1.0  # several samples waiting per worker, on average
    assert [advert.port for advert in found] == [idle.port, busy.port]  # least loaded first
