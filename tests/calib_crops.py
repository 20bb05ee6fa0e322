"""Calibration images for the int8 variants of the board's bundle: crops and mirror images of the photos.

int8 needs 32 images to calibrate on and, without ``--test-data``, 32 more held out to measure its
accuracy on; only the four scikit-image photos are offline, so each gives 11 views (whole, corners,
centres, halves) and their mirror images: 88. The Makefile writes them for its board bundle and the
exporter tests' ``board_bundle`` fixture for its own, so both are the same set.

    python -m tests.calib_crops build/photos build/board-calib/photos
"""

from __future__ import annotations

import sys
from pathlib import Path


def write_crops(photos: Path, out: Path) -> int:
    """Write every view of every PNG in ``photos`` to ``out``; return how many."""
    import skimage.io as io

    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for path in sorted(photos.glob("*.png")):
        image = io.imread(path)[..., :3]
        h, w = image.shape[:2]
        views = {
            "full": image, "tl": image[:h * 3 // 4, :w * 3 // 4], "tr": image[:h * 3 // 4, w // 4:],
            "bl": image[h // 4:, :w * 3 // 4], "br": image[h // 4:, w // 4:], "c": image[h // 8:h * 7 // 8, w // 8:w * 7 // 8],
            "cc": image[h // 4:h * 3 // 4, w // 4:w * 3 // 4], "l": image[:, :w // 2], "r": image[:, w // 2:],
            "t": image[:h // 2], "b": image[h // 2:],
        }
        for name, view in views.items():
            for mirror in ("", "-flip"):
                io.imsave(out / f"{path.stem}-{name}{mirror}.png", view[:, ::-1] if mirror else view, check_contrast=False)
                written += 1
    return written


if __name__ == "__main__":
    print(f"{write_crops(Path(sys.argv[1]), Path(sys.argv[2]))} calibration images in {sys.argv[2]}")
