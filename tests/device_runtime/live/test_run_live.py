"""``split-device run --live``, the command itself: it prints its page's URL with the token of its
``--key-file``, refuses the page without it, and the page shows the frames its trace records."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from device_runtime.live import live_token
from tests.device_runtime.live.browser import browser, read, until  # noqa: F401 (browser: a fixture)
from tests.e2e.test_cli import script, wait_for_line

SHOWN = {"index": "index", "label": "label", "split": "split", "kind": "reason-kind", "status": "status"}


def test_run_live_prints_its_url_with_the_token_and_shows_the_trace(browser: Any, mobilenet_bundle: Path,
                                                                   tmp_path: Path) -> None:
    key_file, trace = tmp_path / "host.key", tmp_path / "run.jsonl"
    key_file.write_text("d" * 64)
    key_file.chmod(0o600)
    proc = subprocess.Popen(
        [*script("split-device"), "run", str(mobilenet_bundle), "--camera", "synthetic:10", "--split", "local",
         "--frames", "3000", "--live", "0", "--key-file", str(key_file), "--trace", str(trace)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        line = wait_for_line(proc, r"live page on http://", timeout=120)[-1]
        url = re.search(r"(http://\S+)", line).group(1)
        assert url.startswith("http://127.0.0.1:") and url.endswith(f"/?token={live_token(b'd' * 64)}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url.partition("?")[0], timeout=10)
        assert refused.value.code == 403
        browser.get(url)
        until(browser, lambda d: read(d, SHOWN)["index"].startswith("#"), "an answered frame")
        shown = read(browser, SHOWN)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 0  # Ctrl-C stops a run as its last frame would: summary, trace closed
    frames = {r["index"]: r for r in map(json.loads, trace.read_text().splitlines()) if r.get("type") == "frame"}
    record = frames[int(shown["index"].split()[0].lstrip("#"))]
    assert shown["status"] == "live"
    assert (shown["label"], shown["split"], shown["kind"]) == (record["label"], record["split"], record["reason"]["kind"])
