"""The live pages' pictures in docs/fieldtrial.md: an emulated trial watched in headless Chromium.

The trial of ``bench/replay_fidelity.py``, with its set-up (as root): the test bundle copied into
``--work`` and calibrated there, the board (``split-device``) on one CPU slowed to ``--board-cpu``,
the host (``split-host serve``) in a shaped link's namespace on the other, the test photos as a
10 fps video played as a live camera, the link stepped through each cell of the calibrated table
(``--step-s`` each, high to low and back). Here the run has ``--live 0`` and the host
``--live ADDRESS:8099``; Chromium opens the host's page as the run starts (its history is the
browser's) and the board's once the schedule has run, takes their pictures (``live-board.png``,
``live-host.png`` in ``--out``), then the run is stopped.

    python bench/live_pictures.py --out docs/fieldtrial
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's packages, not an installed copy

from live_cost import chromium  # noqa: E402
from replay_fidelity import BOARD_CPU, HOST_CPU, PINNED, PORT, auto_schedule, calibrate, device, fresh_work, make_video  # noqa: E402
from slow_board import slowed_cpu  # noqa: E402

from calibration.calibration_file import load  # noqa: E402
from testbed import EmulatedLink, trace_steps  # noqa: E402
from testbed._namespace_host import serve_in  # noqa: E402

LIVE_PORT = 8099
WITHIN_S = 120.0


def _wait(what: str, check, within: float = WITHIN_S):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise SystemExit(f"{what} did not come within {within:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=Path("build/test-bundle"))
    parser.add_argument("--photos", type=Path, default=Path("build/photos"))
    parser.add_argument("--work", type=Path, default=Path("build/bench/live_pictures"))
    parser.add_argument("--step-s", type=float, default=6.0, help="seconds per step of the schedule (default 6)")
    parser.add_argument("--fps", type=float, default=10.0, help="the video's frame rate (default 10)")
    parser.add_argument("--board-cpu", type=float, default=0.5, help="the board's CPU, in cores (default 0.5)")
    parser.add_argument("--out", type=Path, default=Path("build/bench/live_pictures"))
    args = parser.parse_args()
    work, bundle = fresh_work(args.work, args.bundle)
    args.out.mkdir(parents=True, exist_ok=True)
    if PINNED:
        os.sched_setaffinity(0, {HOST_CPU})  # the host and the browser (started from here) inherit it
    slowed = slowed_cpu(BOARD_CPU, args.board_cpu) if PINNED and args.board_cpu < 1 else nullcontext(None)
    with slowed, EmulatedLink() as link, \
            serve_in(link, [bundle], PORT, ["--live", f"{link.namespace_address}:{LIVE_PORT}"]) as host:
        calibrate(bundle, host, link, args.fps)
        schedule = auto_schedule(load(bundle / "calibration.json"), args.step_s, sweeps=1)  # down, up, down
        video = make_video(args.photos, work / "clip.mp4", args.fps, schedule.duration_s + 60.0)
        trace, log_path = work / "run.jsonl", work / "run.log"
        link.set_rate(schedule.rate_at(0))
        record = trace_steps(trace)
        with open(log_path, "w") as log:
            run = device(["run", str(bundle), "--host", host, "--split", "auto", "--camera", str(video), "--realtime",
                          "--trace", str(trace), "--threads", "1", "--live", "0"], log)
            try:
                url = _wait("the run's live page", lambda: re.search(r"live page on (http://\S+)", log_path.read_text()))[1]
                _wait("the first frame", lambda: trace.exists() and len(trace.read_text().splitlines()) > 1)
                browser = chromium()
                try:
                    browser.set_window_size(1280, 1000)
                    # The host's page keeps its history in the browser: open from the start. The
                    # board's page gets the last minute from the board when it opens.
                    browser.get(f"http://{link.namespace_address}:{LIVE_PORT}/")
                    asyncio.run(schedule.drive(link, record))
                    host_tab = browser.current_window_handle
                    browser.switch_to.new_window("tab")
                    for name, page, ready in (
                        ("live-board.png", url, "return document.getElementById('frame').dataset.index;"),
                        ("live-host.png", None, "return document.querySelectorAll('#boards tbody tr').length;"),
                    ):
                        if page is None:
                            browser.switch_to.window(host_tab)
                        else:
                            browser.get(page)
                        _wait(f"{name}'s page", lambda: browser.execute_script(ready))
                        time.sleep(2.0)  # a few events drawn, the picture loaded
                        browser.save_screenshot(str(args.out / name))
                        print(f"wrote {args.out / name}")
                finally:
                    browser.quit()
            finally:
                run.send_signal(signal.SIGINT)
                run.wait(60)


if __name__ == "__main__":
    main()
