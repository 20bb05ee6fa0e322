"""A user's own model as they would bring it: a factory file where they stand, a model that prints, a wrong file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPLIT_EXPORT = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "split-export"

FACTORY = '''
import torch

class Chatty(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(4 * 16 * 16, 5)

    def forward(self, x):
        print("forward with", x.shape)  # research code prints
        return self.fc(self.a(x).view(x.size(0), -1))

def make():
    print("building the model")
    return Chatty()
'''


def split_export(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The console script as installed, run where the user stands (no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(SPLIT_EXPORT), *argv], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def test_a_factory_beside_the_user_imports_and_what_it_prints_stays_off_json(tmp_path: Path) -> None:
    (tmp_path / "mynet.py").write_text(FACTORY)
    out = split_export("points", "mynet:make", "--input-shape", "3,32,32", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    cuts = json.loads(out.stdout)  # stdout is JSON alone
    assert [c["id"] for c in cuts] == ["a", "view"]  # view(x.size(0), -1) folded: no size crosses
    assert "building the model" in out.stderr


def test_a_weights_file_that_is_not_a_torch_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "mynet.py").write_text(FACTORY)
    (tmp_path / "weights.pt").write_bytes(b"this is a text file, not a state dict\n" * 10)
    out = split_export("points", "mynet:make", "--weights", "weights.pt", "--input-shape", "3,32,32", cwd=tmp_path)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()[-1:]
    assert line.startswith("split-export: error: cannot read weights file weights.pt: not a (safe) torch state dict")
    assert "Traceback" not in out.stderr
