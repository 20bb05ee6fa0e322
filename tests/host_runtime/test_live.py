"""The host's live page in a real browser: a board connected to a real host on 127.0.0.1 is
listed with the split it asked for, and the host's figures are the ones its registry counts."""

from __future__ import annotations

import re
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from device_runtime.bundle import Bundle
from device_runtime.live import live_token
from device_runtime.link import HostClient
from host_runtime._live import serve_live
from tests.conftest import TEST_SPLITS, RunningHost, start_host
from tests.e2e.test_cli import script, wait_for_line
from tests.device_runtime.live.browser import browser, read, until  # noqa: F401 (browser: a fixture)

SPLIT = TEST_SPLITS[-1]


def _cut(bundle: Path) -> tuple[str, np.ndarray]:
    manifest = Bundle.load(bundle, roles=()).manifest
    spec = manifest.split(SPLIT).tensor
    return manifest.bundle_id, np.zeros((1, *spec.shape), dtype=spec.dtype)


def test_the_host_page_lists_a_connected_board_and_its_split(browser: Any, host: RunningHost, mobilenet_bundle: Path) -> None:
    bundle_id, cut = _cut(mobilenet_bundle)
    client = host.call(lambda: HostClient.connect(host.host, host.port))
    try:
        for _ in range(3):
            host.call(lambda: client.infer(bundle_id, SPLIT, cut))
        board = "{}:{}".format(*client._protocol.transport.get_extra_info("sockname")[:2])
        with serve_live(host.server, "127.0.0.1:0") as live:
            browser.get(live.url)
            row = until(browser, lambda d: d.execute_script(
                "const tr = document.querySelector(`#boards tr[data-key='${arguments[0]}']`);"
                "return tr && [...tr.children].map((td) => td.textContent);", board), "the connected board")
            shown = until(browser, lambda d: (s := read(d, {"connections": "connections", "answered": "answered",
                                                              "batches": "batches", "status": "status"}))["answered"] == "3"
                          and s, "the three answers")
            tails = browser.execute_script(
                "return [...document.querySelectorAll('#tails tbody tr')].map((tr) => [...tr.children].map((td) => td.textContent));")
            chart = browser.find_element("id", "queue-chart")
            draws = int(chart.get_attribute("data-draws"))
            until(browser, lambda d: int(chart.get_attribute("data-draws")) > draws, "the queue chart redrawn")
            assert [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        host.call(client.close)
    assert row[0] == board and row[1] == f"{SPLIT} (3)" and row[2] == "0"
    stats = host.server.stats.as_dict()
    assert shown["connections"] == "1" and shown["status"] == "live"
    assert shown["batches"].startswith(f"{stats['batch_size']['count']}, ")
    assert [t[:2] for t in tails] == [[f"{bundle_id}/{SPLIT}", "3"]]


def test_with_a_key_the_host_page_asks_for_its_token(mobilenet_bundle: Path) -> None:
    key = b"h" * 32
    for running in start_host([mobilenet_bundle], key=key):
        with serve_live(running.server, "127.0.0.1:0", key) as live:
            base = f"http://127.0.0.1:{live.address[1]}"
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{base}/state.json", timeout=10)
            assert refused.value.code == 403
            with urllib.request.urlopen(f"{base}/state.json?token={live_token(key)}", timeout=10) as answer:
                assert b'"boards":[]' in answer.read()


def test_split_host_serve_live_prints_the_pages_url_with_its_token(mobilenet_bundle: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "host.key"
    key_file.write_text("k" * 64)
    key_file.chmod(0o600)
    proc = subprocess.Popen(
        [*script("split-host"), "serve", str(mobilenet_bundle), "--interface", "127.0.0.1", "--port", "0",
         "--no-zeroconf", "--live", "0", "--key-file", str(key_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        url = re.search(r"live page on (http://\S+)", wait_for_line(proc, r"live page on", timeout=120)[-1]).group(1)
        assert url.startswith("http://127.0.0.1:") and url.endswith(f"/?token={live_token(b'k' * 64)}")
        with urllib.request.urlopen(url.replace("/?", "/state.json?"), timeout=10) as answer:
            assert b'"boards":[]' in answer.read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url.partition("?")[0], timeout=10)
        assert refused.value.code == 403
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "host stopped (SIGINT)" in out
