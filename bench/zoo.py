"""The model zoo: which models of a family split, and how well.

Families (``--family``): ``torchvision``, every model in ``torchvision.models.list_models(module=
torchvision.models)``; ``timm``, a small variant of each edge family timm has (:data:`TIMM_MODELS`,
as ``timm:NAME``); ``hf``, Hugging Face transformers' models built from their configs by
``bench/hf_models.py`` (as ``hf_models:NAME``, ``split-export`` run in ``bench/`` to import it).
All with random weights. For every model, ``split-export points`` and then ``split-export build
--splits auto``, each in a process of its own under a time limit (a model that takes too long, or
more memory than the machine has, is a row of the table, not the end of the run). Each command runs
in a memory cgroup of its own (``--memory``, GB; cgroup v2 or v1's memory controller, so root): a
model too large for the machine is killed there and becomes its row, instead of the kernel's OOM
killer picking whatever else runs (an address-space limit does not do: torch maps far more than it
touches). Each row: cut points, compressive ones, whether the build wrote a bundle, the largest
difference of any float32 artifact against torch (absolute, and relative to the spread of torch's
outputs, as the bundle records them), the time, and with ``--tflite`` which TFLite artifacts the
bundle holds. The ratio the table is judged by is the share of models that build, against the same
run's count of models that trace. ``--against OLD.json``
sets another run's rows beside these (another version of splitedge, run with ``PYTHONPATH`` at its
checkout): which models built there, and the count of each. ``--doc`` writes the family's section
of the document (its heading, its table) and keeps the other families' sections as they are.

    python bench/zoo.py --out build/bench/zoo.json --doc docs/models.md [--tflite] [--models a,b] [--resume]
    python bench/zoo.py --family timm --out build/bench/zoo-timm.json --doc docs/models.md
    python bench/zoo.py --out build/bench/zoo.json --resume --doc docs/models.md --against old.json --against-label v1
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SPLIT_EXPORT = Path(sys.executable).parent / "split-export"
CGROUP_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory"))  # v2, then v1's memory controller
BENCH = Path(__file__).resolve().parent
#: timm's edge families, the smallest variant of each: what a board would run.
TIMM_MODELS = (
    "mobilevit_xxs", "tiny_vit_5m_224", "efficientvit_m0", "efficientvit_b0", "mobilenetv4_conv_small", "fastvit_t8",
    "levit_128s", "ghostnetv2_100", "repvgg_a0", "convnextv2_atto", "edgenext_xx_small", "hgnetv2_b0",
)


@dataclass(frozen=True)
class Family:
    """Models ``split-export`` names alike: its spec for a name, where it runs, and which models there are."""

    title: str  # the models, as the document's heading names them
    spec: str  # a model's spec, {} its name
    names: Callable[[], list[str]]  # every model of the family, for a run without --models
    cwd: Path | None = None  # where split-export runs: a factory's module is imported from there

    @property
    def heading(self) -> str:
        return f"# Models: what `split-export` makes of {self.title}"


def _torchvision_names() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def _hf_names() -> list[str]:
    import hf_models  # beside this script: its directory is on sys.path

    return list(hf_models.__all__)


FAMILIES = {
    "torchvision": Family("torchvision's classification models", "torchvision:{}", _torchvision_names),
    "timm": Family("timm's edge models, a small variant of each family", "timm:{}", lambda: list(TIMM_MODELS)),
    "hf": Family("Hugging Face transformers' vision models, built from their configs", "hf_models:{}", _hf_names,
                 cwd=BENCH),
}


class MemoryCage:
    """A memory cgroup every command is started in (its children follow it there)."""

    def __init__(self, gigabytes: float) -> None:
        self.limit = int(gigabytes * 2**30)
        self.path: Path | None = None
        for root in CGROUP_ROOTS:
            limit_file = _limit_file(root)
            if limit_file is None:
                continue
            path = root / f"splitedge-zoo-{os.getpid()}"
            try:
                path.mkdir()
                (path / limit_file).write_text(str(self.limit))
            except OSError as exc:
                print(f"zoo: no memory cgroup under {root} ({exc.strerror}); trying the next", file=sys.stderr)
                if path.is_dir():
                    path.rmdir()
                continue
            self.path = path
            return
        print("zoo: no memory cgroup available (it needs root); models run without a memory bound", file=sys.stderr)

    def enter(self) -> None:
        """In the child, before it runs the command."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def close(self) -> None:
        """Remove the cgroup once the command in it has gone: one stopped with the run (Ctrl-C)
        takes a moment to exit, and until then the kernel refuses (EBUSY)."""
        if self.path is None:
            return
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                time.sleep(0.1)
        print(f"zoo: {self.path} still holds a process; remove it (rmdir) once that has exited", file=sys.stderr)


def _limit_file(root: Path) -> str | None:
    """The memory limit's file name under ``root`` (v2 with the memory controller, or v1's), or None."""
    controllers = root / "cgroup.controllers"
    if controllers.is_file() and "memory" in controllers.read_text().split():
        return "memory.max"
    return "memory.limit_in_bytes" if (root / "memory.limit_in_bytes").is_file() else None


def _run(argv: list[str], timeout: float, cage: MemoryCage, cwd: Path | None) -> tuple[int | None, str, str, float]:
    """Exit status (None: out of time), stdout, the last line of stderr, and seconds."""
    started = time.monotonic()
    try:
        out = subprocess.run([str(SPLIT_EXPORT), *argv], capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "PYTHONWARNINGS": "ignore"}, preexec_fn=cage.enter, cwd=cwd)
    except subprocess.TimeoutExpired:
        return None, "", f"over the {timeout:g} s limit", time.monotonic() - started
    lines = [line for line in out.stderr.splitlines() if line.strip() and "%|" not in line]
    if out.returncode == -9 and cage.path is not None:
        lines.append(f"killed: over the {cage.limit / 2**30:g} GB memory limit (--memory)")
    return out.returncode, out.stdout, lines[-1] if lines else "", time.monotonic() - started


def one_model(name: str, family: Family, tflite: bool, timeout: float, cage: MemoryCage) -> dict:
    row: dict = {"model": name}
    spec = family.spec.format(name)
    status, stdout, err, seconds = _run(["points", spec, "--json"], timeout, cage, family.cwd)
    row["points_s"] = round(seconds, 1)
    if status != 0:
        row["points_error"] = err
        return row
    cuts = json.loads(stdout)
    row["cut_points"], row["compressive"] = len(cuts), sum(c["compressive"] for c in cuts)
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        out = Path(tmp) / "bundle"
        formats = ["--formats", "onnx,tflite"] if tflite else []
        status, _, err, seconds = _run(["build", spec, "--splits", "auto", *formats, "--out", str(out)], timeout, cage,
                                       family.cwd)
        row["build_s"] = round(seconds, 1)
        if status != 0:
            row["build_error"] = err
            return row
        manifest = json.loads((out / "manifest.json").read_text())
    artifacts = [*manifest["full"], *(a for s in manifest["splits"] for a in s["artifacts"])]
    measured = [a for a in artifacts if a.get("max_abs_error") is not None]
    row["splits"] = len(manifest["splits"])
    # None: the bundle records no figures (an exporter before issue 30's, when the zoo measures it for comparison).
    row["max_abs_error"] = max((a["max_abs_error"] for a in measured), default=None)
    relative = [a["max_rel_error"] for a in measured if a.get("max_rel_error") is not None]
    row["max_rel_error"] = max(relative) if relative else None  # None: torch's outputs never vary (zero head)
    row["constant_outputs"] = len(relative) < len(measured)
    if tflite:
        row["tflite"] = sorted(a["path"] for a in artifacts if a["format"] == "tflite")
        row["tflite_left_out"] = sum(1 for s in manifest["splits"] if not any(
            a["format"] == "tflite" for a in s["artifacts"])) + (not any(a["format"] == "tflite" for a in manifest["full"]))
    return row


def _absolute(row: dict) -> str:
    if "splits" not in row:
        return ""
    return "not recorded" if row["max_abs_error"] is None else f"{row['max_abs_error']:.1e}"


def _relative(row: dict) -> str:
    if "splits" not in row:
        return ""
    shown = "" if row["max_rel_error"] is None else f"{row['max_rel_error']:.1e}"
    return shown + (" (some outputs constant: not validated)" if row["constant_outputs"] else "")


def markdown(rows: list[dict], family: Family, tflite: bool, command: str, total: int,
             against: tuple[str, list[dict]] | None = None) -> str:
    """The family's section of the document: its heading, what the run measured, its table."""
    traced = [r for r in rows if "cut_points" in r]
    built = [r for r in rows if "splits" in r]
    old = {r["model"]: r for r in against[1]} if against is not None else {}
    lines = [
        family.heading,
        "",
        f"Produced by `{command}` on {platform.machine()}, Python {platform.python_version()}, random weights.",
        f"**{len(built)} of {len(rows)} models build with `--splits auto`**; {len(traced)} trace, so "
        f"{len(built) / max(len(traced), 1):.2f} of those that trace build."
        + (f" **Rows for {len(rows)} of the {total} models so far**: the run was stopped part way; "
           "`--resume` runs the rest." if len(rows) < total else ""),
        *(_against_lines(rows, against[0], old) if against is not None else []),
        "",
        "| model | cut points | compressive | builds | splits | max abs diff | of spread | time s |"
        + (" TFLite |" if tflite else "") + (f" {against[0]} |" if against is not None else ""),
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |" + (" --- |" if tflite else "")
        + (" --- |" if against is not None else ""),
    ]
    for r in rows:
        builds = _builds(r)
        seconds = r.get("points_s", 0) + r.get("build_s", 0)
        cells = [r["model"], str(r.get("cut_points", "")), str(r.get("compressive", "")), builds,
                 str(r.get("splits", "")), _absolute(r),
                 _relative(r), f"{seconds:.0f}"]
        if tflite:
            cells.append("" if "splits" not in r else
                         "all" if not r["tflite_left_out"] else f"{r['tflite_left_out']} part(s) left out")
        if against is not None:
            cells.append(_builds(old[r["model"]]) if r["model"] in old else "not run")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def with_section(doc: str, family: Family, section: str) -> str:
    """``doc`` with ``family``'s section replaced by ``section`` (added where it has none), every other
    family's kept as it was, the sections in :data:`FAMILIES`' order: one run measures one family."""
    headings = {f.heading: f for f in FAMILIES.values()}
    sections: dict[Family | None, list[str]] = {}
    current: Family | None = None  # None: what comes before the first family's heading
    for line in doc.splitlines():
        current = headings.get(line, current)
        sections.setdefault(current, []).append(line)
    sections[family] = section.splitlines()
    order = [None, *FAMILIES.values()]
    return "\n\n".join("\n".join(sections[f]).strip("\n") for f in order if f in sections) + "\n"


def _builds(row: dict) -> str:
    """A row's "builds" cell: yes, or no with the command's one-line error."""
    why = row.get("points_error") or row.get("build_error") or ""
    return "yes" if "splits" in row else f"no: {why.replace('|', '/')}"


def _against_lines(rows: list[dict], label: str, old: dict[str, dict]) -> list[str]:
    """The comparison with another run (``--against``), over the models both ran."""
    both = [r for r in rows if r["model"] in old]
    here = {r["model"] for r in both if "splits" in r}
    there = {r["model"] for r in both if "splits" in old[r["model"]]}
    gained, lost = sorted(here - there), sorted(there - here)
    return ["", f"**Against {label}: of the {len(both)} models both runs measured, {len(there)} built there and "
            f"{len(here)} build here.**"
            + (f" Build here and not there: {', '.join(gained)}." if gained else "")
            + (f" Built there and not here: {', '.join(lost)}." if lost else "")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the rows")
    parser.add_argument("--doc", type=Path, help="Markdown document to write the family's section of, its other "
                        "families' sections kept (docs/models.md)")
    parser.add_argument("--family", choices=FAMILIES, default="torchvision",
                        help="torchvision's classification models (default), timm's edge models, or Hugging Face "
                        "models built from their configs (bench/hf_models.py)")
    parser.add_argument("--models", help="comma-separated names of the family's models (default: every one)")
    parser.add_argument("--tflite", action="store_true", help="build TFLite artifacts too")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for each command of each model")
    parser.add_argument("--memory", type=float, default=8.0, help="GB each command may hold (default 8)")
    parser.add_argument("--against", type=Path, metavar="OLD.json",
                        help="another run's rows (its --out) to set beside these: which models built there")
    parser.add_argument("--against-label", default="before", help="that run's name in the table (default: before)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows already in --out and run only the models they lack (a run stopped part way)")
    args = parser.parse_args(argv)
    family = FAMILIES[args.family]
    names = args.models.split(",") if args.models else family.names()
    total = len(names)
    rows = json.loads(args.out.read_text()) if args.resume and args.out.is_file() else []
    done = {row["model"] for row in rows}
    names = [name for name in names if name not in done]
    cage = MemoryCage(args.memory)
    for sig in (signal.SIGINT, signal.SIGTERM):  # both, even when started as a background job (SIGINT ignored)
        signal.signal(sig, _stop)
    try:
        _zoo(names, family, args, cage, rows)
    except KeyboardInterrupt:  # stopped part way: what was measured is written, --resume goes on
        print(f"stopped after {len(rows)} of {total} models", file=sys.stderr)
    finally:
        cage.close()
    against = (args.against_label, json.loads(args.against.read_text())) if args.against is not None else None
    if args.doc:
        command = "python bench/zoo.py " + shlex.join(argv if argv is not None else sys.argv[1:])
        doc = args.doc.read_text() if args.doc.is_file() else ""
        args.doc.write_text(with_section(doc, family, markdown(rows, family, args.tflite, command, total, against)))
    print(markdown(rows, family, args.tflite, "bench/zoo.py", total, against))
    return 0


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _zoo(names: list[str], family: Family, args: argparse.Namespace, cage: MemoryCage, rows: list[dict]) -> None:
    for i, name in enumerate(names, 1):
        rows.append(one_model(name, family, args.tflite, args.timeout, cage))
        row = rows[-1]
        print(f"[{len(rows)}/{len(rows) - i + len(names)}] {name}: " + (f"{row['splits']} splits, max rel diff {_relative(row)}"
                                                 if "splits" in row else row.get("points_error") or row.get("build_error")),
              flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2) + "\n")  # what was measured survives a stopped run


if __name__ == "__main__":
    raise SystemExit(main())
