"""``split-host serve --procs N`` (issue 19): N processes on one port, checked on this machine's
2 cores: real requests from several boards answered right, both processes given connections,
one metrics endpoint that sums them, one clean shutdown with no process left; a process that
dies stops the host with status 2."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from device_runtime.bundle import Bundle
from device_runtime.link import HostClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from host_runtime._metrics import HostStats
from host_runtime import cli as host_cli
from host_runtime.cli import build_parser
from host_runtime._procs import AUTO, auto_procs, sum_scrapes
from tests.conftest import TEST_SPLITS
from tests.host_runtime.helpers import cut, port_from_log, serve_process, unbatched

SPLIT = TEST_SPLITS[1]
BOARDS = 16


def started(log: Path, process: subprocess.Popen, timeout: float = 120.0) -> tuple[int, list[int], int]:
    """The port, the children's pids and the metrics port the parent printed once every child listened."""
    port = port_from_log(process, log, timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = log.read_text().splitlines()
        pids = [line for line in lines if " processes on port " in line]
        metrics = [line for line in lines if line.startswith("metrics on ")]
        if pids and metrics:
            children = [int(pid) for pid in pids[0].split("pids ")[1].split(", ")]
            return port, children, int(metrics[0].split()[2].rsplit(":", 1)[1].split("/")[0])
        time.sleep(0.05)
    raise AssertionError(log.read_text())


def metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_gone(pids: list[int], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(gone(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


def test_two_processes_share_one_port_balance_sum_and_stop_cleanly(mobilenet_bundle, tmp_path) -> None:
    bundle = Bundle.load(mobilenet_bundle)
    log = tmp_path / "host.log"
    process = serve_process(mobilenet_bundle, log, "--procs", "2", "--metrics-port", "0", "--workers", "1")
    children: list[int] = []
    try:
        port, children, metrics_port = started(log, process)
        assert len(children) == 2 and process.pid not in children
        tensors = [cut(bundle, SPLIT, 1, seed=i) for i in range(BOARDS)]
        expected = unbatched(bundle, SPLIT, tensors)

        async def boards() -> list[list[np.ndarray]]:
            clients = await asyncio.gather(*(HostClient.connect("127.0.0.1", port) for _ in range(BOARDS)))
            try:
                async def board(client: HostClient, x: np.ndarray) -> list[np.ndarray]:
                    return [(await client.infer(bundle.id, SPLIT, x, 30.0)).output for _ in range(3)]

                return await asyncio.gather(*(board(c, x) for c, x in zip(clients, tensors)))
            finally:
                await asyncio.gather(*(c.close() for c in clients))

        answers = asyncio.run(boards())
        for outputs, want in zip(answers, expected):
            for output in outputs:
                np.testing.assert_allclose(output, want, atol=1e-5, rtol=0)
        values = metrics(metrics_port)
        # Summed over both processes: every request once.
        assert values[("splitedge_host_requests_total", (("op", "infer"),))] == 3 * BOARDS
        assert values[("splitedge_host_requests_total", (("op", "hello"),))] == BOARDS
        assert values[("splitedge_host_processes_up", ())] == 2
        count = values[("splitedge_host_compute_seconds_count", (("bundle", bundle.id), ("split", SPLIT)))]
        assert count == 3 * BOARDS
        per_process = [values[("splitedge_host_process_requests_total", (("op", "hello"), ("process", str(i))))]
                       for i in range(2)]
        assert sum(per_process) == BOARDS and min(per_process) >= 1, per_process  # the kernel used both
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 128 + signal.SIGTERM, log.read_text()  # 143: stopped by SIGTERM, in one line
        assert wait_gone(children), "a child outlived its parent"
        assert log.read_text().splitlines()[-1] == "host stopped (SIGTERM)"
    finally:
        reap(process, children)


def reap(process, children: list[int]) -> None:
    """Whatever a failed test left running: the parent, then any child that outlived it."""
    if process.poll() is None:
        process.kill()
        process.wait(10)
    for pid in children:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_process_that_dies_stops_the_host(mobilenet_bundle, tmp_path) -> None:
    log = tmp_path / "host.log"
    process = serve_process(mobilenet_bundle, log, "--procs", "2", "--metrics-port", "0", "--workers", "1")
    children: list[int] = []
    try:
        _, children, _ = started(log, process)
        os.kill(children[0], signal.SIGKILL)
        assert process.wait(30) == 2
        assert wait_gone(children)
        text = log.read_text()
        assert f"split-host: error: process 0 (pid {children[0]}) exited with status -9; the host stopped its " \
               "other processes" in text
    finally:
        reap(process, children)


def test_a_port_in_use_is_refused_before_any_process_starts(mobilenet_bundle) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "host_runtime.cli", "serve", str(mobilenet_bundle), "--interface", "127.0.0.1",
                   "--port", str(port), "--no-zeroconf", "--procs", "2"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"port {port} on 127.0.0.1 is in use" in result.stderr
    assert " processes on port " not in result.stdout


def test_summing_adds_every_sample_and_drops_created() -> None:
    """Two children's real registries, scraped as text and summed (a third did not answer)."""
    children = []
    for infers, depth, batches in ((3, 1, (1, 4)), (4, 2, (2,))):
        stats = HostStats(connections=lambda: 1, in_flight=lambda: 0, queue_depth=lambda d=depth: d)
        for _ in range(infers):
            stats.request("infer")
        for batch in batches:
            stats.batch_size.observe(batch)
        children.append(generate_latest(stats.registry).decode())
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in sum_scrapes([children[0], None, children[1]]) for s in family.samples}
    assert samples[("splitedge_host_requests_total", (("op", "infer"),))] == 7
    assert not any(name.endswith("_created") for name, _ in samples)
    assert samples[("splitedge_host_queue_depth", ())] == 3
    assert samples[("splitedge_host_connections", ())] == 2
    assert samples[("splitedge_host_batch_size_bucket", (("le", "1.0"),))] == 1
    assert samples[("splitedge_host_batch_size_bucket", (("le", "+Inf"),))] == 3
    assert samples[("splitedge_host_batch_size_sum", ())] == 7
    assert samples[("splitedge_host_processes_up", ())] == 2
    assert samples[("splitedge_host_process_requests_total", (("op", "infer"), ("process", "2")))] == 4


@pytest.mark.parametrize("cores, cuda, workers, expected", [
    (16, True, 2, 4),  # an H200 host's 16 cores: 4 processes, the best measured there (issue 32)
    (64, True, 2, 8),  # never more than MAX_CUDA_PROCS: each process holds its sessions in GPU memory
    (12, True, 4, 2),  # more workers per process, fewer processes
    (3, True, 2, 1),
    (1, True, 2, 1),
    (2, False, 2, 1),  # this VM: the tail workers need both cores
    (31, False, 31, 1),
    (64, False, 64, 4),  # one front end per 16 cores of CPU tails
])
def test_procs_auto_is_a_pure_function_of_the_cores_and_the_device(cores, cuda, workers, expected) -> None:
    procs, why = auto_procs(cores, cuda, workers)
    assert procs == expected
    assert auto_procs(cores, cuda, workers) == (procs, why)  # no timing: the same machine, the same answer
    assert ("CUDA" if cuda else "CPU") in why and str(cores) in why


def test_procs_takes_a_number_or_auto_and_nothing_else() -> None:
    parser = build_parser()
    assert parser.parse_args(["serve", "b/", "--procs", "auto"]).procs == AUTO
    assert parser.parse_args(["serve", "b/", "--procs", "3"]).procs == 3
    for wrong in ("0", "many"):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "b/", "--procs", wrong])


def test_procs_auto_says_what_it_chose_and_why(mobilenet_bundle, tmp_path) -> None:
    """On the CPU, whatever this machine's cores: the count the function gives, said before the host listens."""
    log = tmp_path / "host.log"
    process = serve_process(mobilenet_bundle, log, "--device", "cpu", "--procs", "auto")
    try:
        port_from_log(process, log)
        procs, why = auto_procs(len(os.sched_getaffinity(0)), cuda=False, workers=1)
        assert f"--procs auto: {procs} process{'es' if procs > 1 else ''} ({why})" in log.read_text().splitlines()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)


@pytest.mark.parametrize("procs, said", [("2", ""), ("auto", " (--procs auto chose 4 here)")])
def test_live_takes_one_process_and_says_what_auto_chose(procs, said, monkeypatch, capsys) -> None:
    """--live shows one process's queue: refused with more, and with auto only once auto has
    chosen more (here, told of 64 cores on the CPU: 4), saying so; not before it has chosen."""
    monkeypatch.setattr(host_cli, "usable_cores", lambda: 64)
    with pytest.raises(SystemExit) as exit:
        host_cli.main(["serve", "b/", "--device", "cpu", "--procs", procs, "--live", "0", "--no-zeroconf"])
    assert exit.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == f"split-host: error: --live shows one process's connections and queue: use it with --procs 1{said}"
