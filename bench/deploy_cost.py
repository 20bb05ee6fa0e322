"""Deploy cost: bytes sent and time for a first deploy and a redeploy, three boards in parallel on loopback.

The boards are real OpenSSH servers on 127.0.0.1 (:mod:`testbed._ssh_boards`), each with its own
user, running splitedge installed from its wheel. Measured in the same run:

- ``split-export deploy`` (the library's :class:`exporter.deploy.Fleet`): a first deploy of the
  bundle, then a redeploy where one head changed (:func:`testbed._ssh_boards.one_head_changed`):
  rsync hard-links every file the release in use has and sends the head and the manifest;
- baseline "by hand": the whole bundle (tails included) copied with ``scp -r`` to each board
  in parallel, the way users did it before: bytes are the files' sizes (scp sends them whole);
- baseline "tar": the same deploy's upload with the board's rsync ignored (tar over ssh, as for
  a board without rsync): every file of the slice, first time and again.

Every deploy and copy is timed from the workstation (wall clock, the three boards at once),
verification on the board and the switch included for the deploys. Loopback: the time is the
tools' and the boards' CPU, not a Wi-Fi link's; the bytes are what a link would carry.

    python bench/deploy_cost.py --out build/bench/deploy_cost.json   # as root
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout, whatever the interpreter has installed

from exporter.deploy import Fleet  # noqa: E402
from testbed.board_box import build_wheel  # noqa: E402
from testbed._ssh_boards import SshBoards, install_board_venv, one_head_changed, unavailable_reason  # noqa: E402

BOARDS = ("board1", "board2", "board3")


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def deploy_row(fleet: Fleet, bundle: Path, label: str) -> dict:
    start = time.perf_counter()
    result = fleet.deploy(bundle)
    seconds = time.perf_counter() - start
    if not result.ok:
        raise SystemExit(f"{label}: " + "; ".join(b.line() for b in result.boards if not b.ok))
    sent = [b.sent_bytes for b in result.boards]
    return {"case": label, "bytes_per_board": max(sent), "seconds": seconds, "method": result.boards[0].method}


def scp_row(boards: SshBoards, bundle: Path) -> dict:
    def copy(name: str) -> None:
        subprocess.run(["scp", "-q", "-r", "-F", str(boards.ssh_config), "-o", "BatchMode=yes", str(bundle),
                        f"{name}:bundle-by-hand"], check=True, timeout=600)

    start = time.perf_counter()
    with ThreadPoolExecutor(len(BOARDS)) as pool:
        list(pool.map(copy, BOARDS))
    return {"case": "by hand: scp -r of the whole bundle", "bytes_per_board": tree_bytes(bundle),
            "seconds": time.perf_counter() - start, "method": "scp"}


def tar_rows(fleet: Fleet, bundles: list[tuple[str, Path]], work: Path) -> list[dict]:
    rows = []
    for label, bundle in bundles:
        release = fleet.slice(bundle, work / label.replace(" ", "-"), None, None)

        def upload(name: str) -> int:
            return fleet.remote(name).upload(release.path, f"tar-baseline/{release.id}", None, False).sent

        start = time.perf_counter()
        with ThreadPoolExecutor(len(BOARDS)) as pool:
            sent = list(pool.map(upload, BOARDS))
        rows.append({"case": f"tar over ssh: {label} (upload only)", "bytes_per_board": max(sent),
                     "seconds": time.perf_counter() - start, "method": "tar"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=ROOT / "build" / "demo-bundle",
                        help="the MobileNetV2 bundle (default build/demo-bundle: make demo writes it)")
    parser.add_argument("--out", type=Path, default=Path("build/bench/deploy_cost.json"))
    args = parser.parse_args()
    if reason := unavailable_reason():
        raise SystemExit(f"cannot make boards here: {reason}")
    with tempfile.TemporaryDirectory(prefix="deploy-cost-") as tmp:
        work = Path(tmp)
        shared = Path(tempfile.mkdtemp(prefix="splitedge-boards-", dir="/tmp"))
        shared.chmod(0o755)
        try:
            started = time.perf_counter()
            install = install_board_venv(build_wheel(ROOT, shared / "wheel"), shared / "venv")
            print(f"board install (wheel + pip install [device,tflite,camera]): {time.perf_counter() - started:.1f} s")
            changed = one_head_changed(args.bundle, work / "changed")
            with SshBoards(install) as boards:
                for name in BOARDS:
                    boards.add(name)
                with Fleet(list(BOARDS), boards.ssh_config, say=lambda line: None) as fleet:
                    rows = [scp_row(boards, args.bundle),
                            deploy_row(fleet, args.bundle, "split-export deploy: first"),
                            deploy_row(fleet, changed, "split-export deploy: one head changed"),
                            *tar_rows(fleet, [("first", args.bundle), ("one head changed", changed)], work)]
        finally:
            subprocess.run(["rm", "-rf", str(shared)])
    by_hand = rows[0]
    print(f"\n{'case':<48} {'MB sent / board':>16} {'vs by hand':>11} {'s (3 boards)':>13}")
    for row in rows:
        row["bytes_vs_by_hand"] = row["bytes_per_board"] / by_hand["bytes_per_board"]
        print(f"{row['case']:<48} {row['bytes_per_board'] / 1e6:>16.3f} {row['bytes_vs_by_hand']:>11.4f} "
              f"{row['seconds']:>13.2f}")
    report = {"benchmark": "deploy_cost", "bundle": str(args.bundle), "bundle_bytes": tree_bytes(args.bundle),
              "machine": platform.machine(), "python": platform.python_version(), "cpus": os.cpu_count(),
              "load": os.getloadavg(), "boards": len(BOARDS), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
