"""The board's live page in a real browser, during a real stream against a real host on 127.0.0.1.

What the page shows is checked against the trace the same run writes: a frame's label, score,
split and reason as the page says them are the trace's record of that frame, and so is the
caption of the picture it shows; the figures keep moving while the stream runs.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calibration import SplitTable
from device_runtime.bundle import LOCAL, Bundle
from device_runtime.engine import DeviceRunner
from device_runtime.hosts import HostLink
from device_runtime.live import LiveBoard, live_token
from device_runtime.stream import (
    Frame, FrameResult, FrameSource, Pipeline, PipelineConfig, Reason, StaticPolicy, open_source,
)
from device_runtime.stream.trace import TraceWriter
from tests.conftest import TEST_SPLITS, RunningHost
from tests.device_runtime.live.browser import browser, read, until  # noqa: F401 (browser: a fixture)

SPLIT = TEST_SPLITS[-1]
#: A table with one boundary (local below, SPLIT above ~3.16 Mbit/s): the page draws it.
TABLE = SplitTable(batches=(1,), rates_bps=(1e6, 1e7, 1e8), splits=(LOCAL, SPLIT), best=((0, 1, 1),))
SHOWN = {"index": "index", "label": "label", "score": "score", "split": "split", "kind": "reason-kind",
         "why": "why", "status": "status", "cell": "cell"}


class _Paced(FrameSource):
    """The photos, again and again, ten a second: a stream that runs until stopped, at a pace a
    busy machine keeps."""

    def __init__(self, source: FrameSource, period_s: float = 0.1) -> None:
        self.source, self.period_s = source, period_s
        self.description = source.description

    def __iter__(self) -> Iterator[Frame]:
        for frame in self.source:
            time.sleep(self.period_s)
            yield frame

    def close(self) -> None:
        self.source.close()


class _Stream:
    """A real pipeline (the test bundle's head here, its tail on ``host``) publishing to ``board``
    and writing a trace, in a thread of its own until :meth:`stop`."""

    def __init__(self, bundle: Path, photos: Path, host: RunningHost, board: LiveBoard, trace: Path) -> None:
        self.bundle, self.photos, self.host, self.board, self.trace = bundle, photos, host, board, trace
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-stream", daemon=True)

    def __enter__(self) -> _Stream:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._stream())
        except BaseException as exc:  # reported by the test
            self.failure = exc

    async def _stream(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        bundle = Bundle.load(self.bundle, roles=("head", "full"))
        runner = DeviceRunner(bundle, threads=1)
        runner.warm_up(SPLIT)
        hosts = HostLink(bundle, f"{self.host.host}:{self.host.port}")
        assert await hosts.connect(), hosts.last_error
        pipeline = Pipeline(runner, StaticPolicy(SPLIT, bundle), hosts, PipelineConfig())
        try:
            with TraceWriter(self.trace, {"bundle_id": bundle.id}) as trace, \
                    _Paced(open_source(str(self.photos), loop=True)) as source:
                async for result in pipeline.run(self.board.watch(source), stop=self._stop):
                    self.board.publish(result)
                    trace.frame(result)
        finally:
            await hosts.close()

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        assert not self._thread.is_alive(), "the stream did not stop"
        if self.failure is not None:
            raise self.failure


def _trace(path: Path) -> dict[int, dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["index"]: r for r in records if r.get("type") == "frame" and not r["dropped"]}


def _kind(record: dict[str, Any]) -> str:
    reason = record.get("reason")
    return reason["kind"] if reason else "—"


def test_the_page_shows_each_frame_as_the_trace_records_it_and_keeps_moving(
    browser: Any, host: RunningHost, mobilenet_bundle: Path, photos_dir: Path, tmp_path: Path,
) -> None:
    board = LiveBoard()
    board.plan(TABLE, 1)
    trace = tmp_path / "run.jsonl"
    with _Stream(mobilenet_bundle, photos_dir, host, board, trace), board.serve("127.0.0.1:0") as server:
        assert server.address[0] == "127.0.0.1" and server.token is None
        browser.get(server.url)
        until(browser, lambda d: read(d, SHOWN)["index"].startswith("#"), "an answered frame")
        until(browser, lambda d: d.execute_script(
            "const img = document.getElementById('frame'); return img.complete && img.naturalWidth > 0 && img.dataset.index;"),
            "the latest frame's picture")
        first = read(browser, SHOWN)
        rate = browser.find_element("id", "rate-chart")
        draws = int(rate.get_attribute("data-draws"))
        # The figures move: a later frame, the rate chart redrawn with points and the table's boundary.
        until(browser, lambda d: read(d, SHOWN)["index"] != first["index"], "a later frame")
        until(browser, lambda d: int(rate.get_attribute("data-draws")) > draws, "the rate chart redrawn")
        later = read(browser, SHOWN)
        assert int(rate.get_attribute("data-points")) > 0 and rate.get_attribute("data-marks") == "1"
        assert int(browser.find_element("id", "stage-chart").get_attribute("data-points")) > 0
        stages = browser.execute_script(
            "return [...document.querySelectorAll('#stages tbody tr')].map((tr) => [...tr.children].map((td) => td.textContent));")
        assert [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []  # no script failed
        # A picture can come before the state with its frame's answer: it is captioned once that comes.
        picture, caption_shown = until(browser, lambda d: (lambda shown: shown if ":" in shown[1] else None)(d.execute_script(
            "return [document.getElementById('frame').dataset.index, document.getElementById('caption').textContent];")),
            "the picture's caption")
    answered = _trace(trace)
    for shown in (first, later):
        assert shown["status"] == "live"
        record = answered[int(shown["index"].split()[0].lstrip("#"))]
        assert (shown["label"], shown["score"], shown["split"], shown["kind"]) == \
            (record["label"], f"{record['probability']:.3f}", record["split"], _kind(record))
        (boundary, below, above), = TABLE.boundaries(1)  # the cell the page names is the table's at the frame's rate
        assert shown["split"] == SPLIT and shown["cell"].startswith(f"{above if record['rate_bps'] >= boundary else below} for ")
    pictured = answered[int(picture)]  # the picture is of an answered frame, captioned as the trace has it
    assert caption_shown == f"#{picture}: {pictured['label']} {pictured['probability']:.3f}, split {pictured['split']}"
    assert [row[0] for row in stages] == ["preprocess", "head", "transfer", "tail", "waits", "total"]
    assert all(float(value) >= 0 for row in stages for value in row[1:])


@pytest.mark.parametrize(("reason", "cell"), [
    (Reason("table", batch=1, rate_bps=5e6, lo_bps=3.16e6), f"{SPLIT} for 3.16 Mbit/s – ∞"),
    (Reason("hold", batch=1, rate_bps=2e6, lo_bps=1e6, hi_bps=3.16e6, wanted=LOCAL, streak=2),
     f"{LOCAL} for 1.00 Mbit/s – 3.16 Mbit/s"),
])
def test_the_page_says_the_reasons_cell_and_fields(browser: Any, reason: Reason, cell: str) -> None:
    """A reason's own cell (the table the run chose with may have been rebuilt with its head
    times) and every field it fills, rates in Mbit/s; its sentence as the printed line says it."""
    board = LiveBoard()
    board.plan(TABLE, 1)
    with board.serve("127.0.0.1:0") as server:
        board.publish(FrameResult(index=7, name="coffee.png", label="espresso", probability=0.9, split=SPLIT,
                                  captured=time.monotonic(), rate_bps=reason.rate_bps, reason=reason))
        browser.get(server.url)
        until(browser, lambda d: read(d, SHOWN)["index"] == "#7 coffee.png", "the frame")
        shown = read(browser, SHOWN)
        fields = browser.execute_script(
            "return [...document.querySelectorAll('#reason dt')].map((dt) => [dt.textContent, dt.nextSibling.textContent]);")
    assert (shown["kind"], shown["why"]) == (reason.kind, reason.text())
    assert shown["cell"] == f"{cell} (batch 1)"
    assert dict(fields) == {k: f"{v / 1e6:#.3g} Mbit/s" if k.endswith("_bps") else str(v)  # 3 digits, as the page
                            for k, v in reason.as_dict().items() if k != "kind"}


def test_with_a_key_the_page_asks_for_its_token(browser: Any, tmp_path: Path) -> None:
    key = b"k" * 32
    board = LiveBoard()
    with board.serve("127.0.0.1:0", key=key) as server:
        base = f"http://127.0.0.1:{server.address[1]}"
        assert server.url == f"{base}/?token={live_token(key)}"
        for path in ("/", "/events", "/state.json", "/frame.jpg", f"/?token={live_token(b'x' * 32)}"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(base + path, timeout=10)
            assert refused.value.code == 403, path
        with urllib.request.urlopen(f"{base}/state.json?token={live_token(key)}", timeout=10) as answer:
            assert json.loads(answer.read())["frames"] == []
        browser.get(base + "/")
        assert "needs its token" in browser.find_element("tag name", "body").text
        browser.get(server.url)
        until(browser, lambda d: read(d, SHOWN)["status"] == "live", "the page connected with its token")
