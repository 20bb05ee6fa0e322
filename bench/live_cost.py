"""What ``split-device run --live`` costs the board's stream (issue 31: at most 3 % of one core at 30 fps).

In one run, the same stream with and without the live page, alternated round by round so the
machine's load moves both alike: the bundle's full model on the board (``--split local``, one
thread, no host: the host's work would count in this process), a synthetic 640×480 camera at
``--fps``, the pipeline publishing every result to a :class:`device_runtime.live.LiveBoard` through
:meth:`~device_runtime.live.LiveBoard.watch` and :meth:`~device_runtime.live.LiveBoard.publish`,
as ``run`` does. With the page, a watcher is connected the whole time: headless Chromium on the
page itself (its events ten times a second, a JPEG each time a newer frame is answered, at most
five a second) where Chromium is installed, else a Python client asking the same. The watcher is
another process, as a browser on a laptop would be: only the board's side is counted.

The stream's CPU is this process's (every thread: capture, preprocessing, the model, the event
loop, the page's server) over a steady window after a warm-up; the cost of the page is the
difference with and without it, in % of one core, and the ratio of the two. The per-frame hook
is also timed alone (ns per publish and per watched frame).

    .venv-device/bin/python bench/live_cost.py build/test-bundle --seconds 20 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from device_runtime import FULL, LOCAL, Bundle  # noqa: E402
from device_runtime.engine import DeviceRunner  # noqa: E402
from device_runtime.live import LiveBoard  # noqa: E402
from device_runtime.stream import FrameResult, Pipeline, PipelineConfig, StaticPolicy, open_source  # noqa: E402

WARM_UP_S = 3.0


def _stream(runner: DeviceRunner, bundle: Bundle, fps: float, seconds: float, board: LiveBoard | None) -> dict:
    """Run the stream for a warm-up and ``seconds`` more; CPU, wall time and frames of the window."""

    async def go() -> dict:
        stop = asyncio.Event()
        pipeline = Pipeline(runner, StaticPolicy(LOCAL, bundle), None, PipelineConfig())
        window: dict = {}
        loop = asyncio.get_running_loop()

        def mark(key: str) -> None:
            window[key] = (time.process_time(), time.perf_counter(), pipeline.stats.frames, pipeline.stats.dropped)

        loop.call_later(WARM_UP_S, mark, "start")
        loop.call_later(WARM_UP_S + seconds, lambda: (mark("end"), stop.set()))
        with open_source(f"synthetic:{fps:g}") as camera:
            source = camera if board is None else board.watch(camera)
            async for result in pipeline.run(source, stop=stop):
                if board is not None:
                    board.publish(result)
        (cpu0, wall0, frames0, dropped0), (cpu1, wall1, frames1, dropped1) = window["start"], window["end"]
        return {"cpu_s": cpu1 - cpu0, "wall_s": wall1 - wall0, "frames": frames1 - frames0,
                "dropped": dropped1 - dropped0}

    return asyncio.run(go())


def chromium() -> Any:
    """Headless Chromium driven by Selenium (Debian's chromium and chromium-driver)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    # No sandbox: it refuses to run as root, and needs user namespaces a container may not give.
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)


class Watcher:
    """A page kept open on the live server: Chromium where installed, else :func:`python_client`."""

    def __init__(self, url: str, client: str) -> None:
        self.kind = client
        if client == "chromium":
            self.driver = chromium()
            self.driver.get(url)
            self.process = None
        else:
            self.driver = None
            self.process = subprocess.Popen([sys.executable, __file__, "--client-for", url])

    def pictures(self) -> int:
        """Pictures the page has shown (Chromium only: -1 otherwise)."""
        if self.driver is None:
            return -1
        return int(self.driver.execute_script("return document.getElementById('frame').dataset.index ? 1 : 0;"))

    def close(self) -> None:
        if self.driver is not None:
            self.driver.quit()
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)


def python_client(url: str) -> None:
    """What the page asks, without a browser: the events, and a picture each time a newer frame is
    answered, at most five a second."""
    base, _, query = url.partition("?")
    token = f"?{query}" if query else ""
    shown = None
    with urllib.request.urlopen(f"{base}events{token}", timeout=30) as events:
        for line in events:
            if not line.startswith(b"data: "):
                continue
            frames = [f for f in json.loads(line[6:])["frames"] if not f["dropped"]]
            if frames and frames[-1]["index"] != shown:
                with urllib.request.urlopen(f"{base}frame.jpg{token}", timeout=30) as picture:
                    picture.read()
                shown = frames[-1]["index"]
                time.sleep(0.2)


def hook_ns(repeats: int = 200_000) -> dict[str, float]:
    """ns per call of the per-frame work ``run --live`` adds: publish a result, watch a frame."""
    board = LiveBoard()
    result = FrameResult(index=0, name="frame", label="label", probability=0.5, split=LOCAL)
    start = time.perf_counter()
    for _ in range(repeats):
        board.publish(result)
    publish = (time.perf_counter() - start) / repeats * 1e9
    with open_source("synthetic:0") as camera:
        frames = iter(camera)
        start = time.perf_counter()
        for _ in range(repeats // 20):
            next(frames)
        bare = (time.perf_counter() - start) / (repeats // 20)
    with open_source("synthetic:0") as camera:
        watched = iter(board.watch(camera))
        start = time.perf_counter()
        for _ in range(repeats // 20):
            next(watched)
        seen = (time.perf_counter() - start) / (repeats // 20)
    return {"publish_ns": publish, "watch_ns": max(seen - bare, 0.0) * 1e9}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", nargs="?", help="a bundle with a full model (the test bundle: build/test-bundle)")
    parser.add_argument("--fps", type=float, default=30.0, help="the synthetic camera's frame rate (default 30)")
    parser.add_argument("--seconds", type=float, default=20.0, help="each measured window, after a warm-up (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each without then with the page (default 3)")
    parser.add_argument("--client", choices=("auto", "chromium", "python"), default="auto",
                        help="what watches the page (default auto: Chromium where installed)")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--client-for", metavar="URL", help=argparse.SUPPRESS)  # the Python watcher's process
    args = parser.parse_args(argv)
    if args.client_for:
        python_client(args.client_for)
        return 0
    if args.bundle is None:
        parser.error("give a bundle")
    client = args.client
    if client == "auto":
        client = "chromium" if shutil.which("chromedriver") and shutil.which("chromium") else "python"
    bundle = Bundle.load(args.bundle, roles=(FULL,))
    runner = DeviceRunner(bundle, threads=1)
    runner.warm_up(LOCAL)
    rows = []
    for round_ in range(args.rounds):
        plain = _stream(runner, bundle, args.fps, args.seconds, None)
        board = LiveBoard()
        with board.serve("127.0.0.1:0") as server:
            watcher = Watcher(server.url, client)
            try:
                watched = _stream(runner, bundle, args.fps, args.seconds, board)
                pictures = watcher.pictures()
            finally:
                watcher.close()
        extra = (watched["cpu_s"] / watched["wall_s"] - plain["cpu_s"] / plain["wall_s"]) * 100.0
        rows.append({"round": round_ + 1, "without": plain, "with": watched, "extra_core_pct": extra,
                     "ratio": (watched["cpu_s"] / watched["wall_s"]) / (plain["cpu_s"] / plain["wall_s"]),
                     "pictures_shown": pictures})
    hooks = hook_ns()
    print(f"live page cost: {bundle.id} full model (--split local, 1 thread), synthetic 640x480 at {args.fps:g} fps, "
          f"{args.seconds:g} s windows after {WARM_UP_S:g} s, watcher: {client}; {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'round':>5}  {'without: core %':>15} {'fps':>6}  {'with --live: core %':>19} {'fps':>6}  "
          f"{'extra, % of a core':>18} {'ratio':>6}")
    for row in rows:
        plain, watched = row["without"], row["with"]
        print(f"{row['round']:>5}  {100 * plain['cpu_s'] / plain['wall_s']:>15.1f} {plain['frames'] / plain['wall_s']:>6.1f}  "
              f"{100 * watched['cpu_s'] / watched['wall_s']:>19.1f} {watched['frames'] / watched['wall_s']:>6.1f}  "
              f"{row['extra_core_pct']:>18.2f} {row['ratio']:>6.3f}")
    median = statistics.median(r["extra_core_pct"] for r in rows)
    ratio = statistics.median(r["ratio"] for r in rows)
    print(f"median: {median:.2f} % of one core more with --live (ratio {ratio:.3f}); per frame: publish "
          f"{hooks['publish_ns']:.0f} ns, watch {hooks['watch_ns']:.0f} ns")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows, "median_extra_core_pct": median, "median_ratio": ratio,
                                        "hooks": hooks, "client": client, "fps": args.fps}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
