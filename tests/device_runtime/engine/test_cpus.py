"""Sessions sized to the CPUs the process may use, kept on them, and not spinning between turns
(issue 43: calibration's sessions spun against each other, a pool's worker left the process's CPUs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from device_runtime.engine._cpus import cpu_quota, usable_cpus


def test_usable_cpus_are_the_affinity_cut_to_the_cgroup_quota() -> None:
    four = frozenset({0, 1, 2, 3})
    assert usable_cpus(four, quota=8.0) == 4
    assert usable_cpus(four, quota=1.5) == 1  # a second thread on 1.5 CPUs' time only waits its turn
    assert usable_cpus(four, quota=0.25) == 1  # a quarter core still runs one thread
    assert usable_cpus(frozenset({2}), quota=3.0) == 1


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_quota_is_the_smallest_on_the_way_up_the_cgroup_tree_v2(tmp_path: Path) -> None:
    _tree(tmp_path, {"proc": "0::/board.slice/run.scope\n", "fs/board.slice/cpu.max": "25000 100000\n",
                     "fs/board.slice/run.scope/cpu.max": "max 100000\n", "fs/cpu.max": "max 100000\n"})
    assert cpu_quota(tmp_path / "fs", tmp_path / "proc") == 0.25


def test_the_quota_of_cgroup_v1(tmp_path: Path) -> None:
    _tree(tmp_path, {"proc": "12:memory:/x\n4:cpu,cpuacct:/x\n", "fs/cpu,cpuacct/x/cpu.cfs_quota_us": "50000\n",
                     "fs/cpu,cpuacct/x/cpu.cfs_period_us": "100000\n", "fs/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                     "fs/cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(tmp_path / "fs", tmp_path / "proc") == 0.5


@pytest.mark.parametrize("text", ["garbage", "0 100000", "-5 100000", "nan 1", "1 0", ""])
def test_an_unreadable_or_senseless_quota_is_none(tmp_path: Path, text: str) -> None:
    _tree(tmp_path, {"proc": "0::/../../etc\n", "fs/cpu.max": text})
    assert cpu_quota(tmp_path / "fs", tmp_path / "proc") is None
    assert cpu_quota(tmp_path / "fs", tmp_path / "missing") is None


# Run in a process of its own pinned to one CPU: the board's runner opens the full model as
# calibration and the run do, runs it, and reports its session's options and the CPUs each of the
# process's threads may run on.
_PINNED = """
import glob, json, os, sys
os.sched_setaffinity(0, {int(sys.argv[2])})  # before any import starts a thread (numpy's BLAS pool)
import numpy as np
from device_runtime.bundle import Bundle, FULL, LOCAL
from device_runtime.engine import DeviceRunner
runner = DeviceRunner(Bundle.load(sys.argv[1]))
session = runner.session(LOCAL, FULL)
session.run(np.zeros((1, *runner.bundle.manifest.model.input_shape), np.float32))
options = session.session.get_session_options()
threads = []
for status in glob.glob("/proc/self/task/*/status"):
    fields = dict(line.split(":", 1) for line in open(status).read().splitlines() if ":" in line)
    threads.append(fields["Cpus_allowed_list"].strip())
print(json.dumps({"intra": options.intra_op_num_threads, "threads": threads,
                  "spinning": options.get_session_config_entry("session.intra_op.allow_spinning")}))
"""


def test_a_board_session_stays_on_the_process_s_cpus_and_does_not_spin(mobilenet_bundle: Path) -> None:
    """Pinned to one CPU of several, the board's session has one thread (onnxruntime's default pool
    had a worker pinned to another CPU of the machine), and spinning is off: the board's sessions
    take turns, and one's spinning workers would slow the next."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs a process allowed two CPUs, to pin a child to one of them")
    cpu = cpus[0]
    done = subprocess.run([sys.executable, "-c", _PINNED, str(mobilenet_bundle), str(cpu)], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["threads"] and set(seen["threads"]) == {str(cpu)}, seen
    assert (seen["intra"], seen["spinning"]) == (1, "0")


def test_a_session_given_several_cpus_keeps_its_workers_on_them(mobilenet_bundle: Path) -> None:
    """Allowed every CPU of this process, a session's pool has a thread per usable CPU, each worker
    allowed exactly the process's CPUs (onnxruntime counts them from 1)."""
    from device_runtime.bundle import FULL, LOCAL, Bundle
    from device_runtime.engine import DeviceRunner

    session = DeviceRunner(Bundle.load(mobilenet_bundle)).session(LOCAL, FULL)
    options = session.session.get_session_options()
    cpus = sorted(os.sched_getaffinity(0))
    assert options.intra_op_num_threads == usable_cpus()
    if usable_cpus() < 2:
        pytest.skip("one usable CPU: the pool has no worker to place")
    listed = f"{cpus[0] + 1}-{cpus[-1] + 1}" if cpus == list(range(cpus[0], cpus[-1] + 1)) \
        else ",".join(str(c + 1) for c in cpus)
    assert options.get_session_config_entry("session.intra_op_thread_affinities") == \
        ";".join([listed] * (usable_cpus() - 1))
