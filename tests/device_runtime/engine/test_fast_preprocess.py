"""The board's fast preprocessing (OpenCV, uint8) against the exact one (PIL's), and how a run chooses.

The answers are compared on real photos with the real MobileNetV2 (the session's bundle): the fast
path must give the exact path's top-1 on every scikit-image photo, as the build's recorded agreement
says it does. A bundle built before the fast path (no ``folded``, no ``fast_agreement``) still loads
and runs the exact path under ``auto``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from device_runtime.bundle import OFFLOAD, Bundle, Preprocess
from device_runtime.engine import EXACT, FAST, FAST_AGREEMENT, DeviceRunner, fast_preprocess, preprocess, preprocess_path
from device_runtime.engine._fast_preprocess import fast_pixels
from device_runtime.engine._preprocess import exact_pixels, model_input

cv2 = pytest.importorskip("cv2")

IMAGENET = Preprocess(resize=256, crop=224, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def _photos(photos_dir: Path) -> dict[str, np.ndarray]:
    """Each photo as the camera sources hand frames over (an RGB view of OpenCV's BGR memory), as it
    is and at a camera's 640x480."""
    frames = {}
    for path in sorted(photos_dir.glob("*.png")):
        bgr = cv2.imread(str(path))
        frames[path.stem] = bgr[..., ::-1]
        frames[f"{path.stem}@640x480"] = cv2.resize(bgr, (640, 480), interpolation=cv2.INTER_AREA)[..., ::-1]
    return frames


def test_fast_pixels_are_within_a_few_grey_levels_of_the_exact_ones(photos_dir: Path) -> None:
    for name, frame in _photos(photos_dir).items():
        fast, exact = fast_pixels(frame, IMAGENET), exact_pixels(frame, IMAGENET)
        assert fast.dtype == np.uint8 and fast.shape == exact.shape == (3, 224, 224), name
        assert np.abs(fast.astype(np.float32) - exact).mean() < 1.5, name


def test_a_bgr_view_and_its_rgb_copy_preprocess_alike(photos_dir: Path) -> None:
    frame = next(iter(_photos(photos_dir).values()))
    np.testing.assert_array_equal(fast_pixels(frame, IMAGENET), fast_pixels(np.ascontiguousarray(frame), IMAGENET))


def test_the_fast_path_gives_the_exact_paths_top1_on_the_photos(mobilenet_bundle: Path, photos_dir: Path) -> None:
    bundle = Bundle.load(mobilenet_bundle, roles=("full",))
    exact, fast = (DeviceRunner(bundle, preprocess=path) for path in (EXACT, FAST))
    assert (exact.preprocess_path, fast.preprocess_path) == (EXACT, FAST)
    frames = _photos(photos_dir)
    agreed = [int(exact.run_full(exact.preprocess(f))[0].argmax()) == int(fast.run_full(fast.preprocess(f))[0].argmax())
              for f in frames.values()]
    agreement = sum(agreed) / len(agreed)
    print(f"fast vs exact top-1 agreement on {len(agreed)} photo frames: {agreement:.3f}")  # the recorded figure
    assert all(agreed), [name for name, same in zip(frames, agreed) if not same]


def test_auto_takes_the_fast_path_only_where_the_bundle_measured_it_agreeing() -> None:
    assert preprocess_path(IMAGENET, "auto") == EXACT  # not measured: a bundle from before
    assert preprocess_path(replace(IMAGENET, fast_agreement=FAST_AGREEMENT), "auto") == FAST
    assert preprocess_path(replace(IMAGENET, fast_agreement=0.99), "auto") == EXACT
    assert preprocess_path(replace(IMAGENET, fast_agreement=0.2), FAST) == FAST  # the user's word
    with pytest.raises(ValueError, match="preprocess 'quick': expected one of auto, exact, fast"):
        preprocess_path(IMAGENET, "quick")


def test_a_folded_bundle_takes_pixels_and_a_normalising_one_normalised_input(photos_dir: Path) -> None:
    frame = next(iter(_photos(photos_dir).values()))
    folded = replace(IMAGENET, folded=True)
    pixels = fast_preprocess(frame, folded)
    assert pixels.dtype == np.float32 and pixels.min() >= 0 and pixels.max() <= 255
    np.testing.assert_array_equal(pixels, model_input(fast_pixels(frame, folded), folded))
    np.testing.assert_allclose(model_input(exact_pixels(frame, IMAGENET), IMAGENET), preprocess(frame, IMAGENET))
    normalised = fast_preprocess(frame, IMAGENET)
    mean, std = np.asarray(IMAGENET.mean)[:, None, None], np.asarray(IMAGENET.std)[:, None, None]
    np.testing.assert_allclose(normalised, (pixels / 255 - mean) / std, atol=1e-5)


def test_a_bundle_without_the_new_fields_loads_and_runs_the_exact_path(mobilenet_bundle: Path, tmp_path: Path,
                                                                          photos_dir: Path) -> None:
    """A manifest as bundles were written before folding (no folded, no fast_agreement): same identity,
    the exact path under auto, normalised input, float32 for full offload."""
    data = json.loads((mobilenet_bundle / "manifest.json").read_text())
    if data["model"]["preprocess"].get("folded"):
        pytest.skip("the session's bundle is folded; the Makefile's build/test-bundle is the older kind")
    bundle = Bundle.load(mobilenet_bundle, roles=("full",))
    runner = DeviceRunner(bundle)
    assert runner.preprocess_path == EXACT and not runner.spec.folded
    frame = next(iter(_photos(photos_dir).values()))
    x = runner.preprocess(frame)
    np.testing.assert_array_equal(x, preprocess(frame, runner.spec))
    assert runner.run_full(x)[0].shape == (1, 1000)
    sent, fields = runner.payload(OFFLOAD, x)
    assert sent.dtype == np.float32 and fields == {}


def test_full_offload_of_a_folded_bundle_sends_the_uint8_crop(mobilenet_bundle: Path, photos_dir: Path) -> None:
    bundle = Bundle.load(mobilenet_bundle, roles=())
    bundle.manifest = replace(bundle.manifest, model=replace(bundle.manifest.model, preprocess=replace(
        bundle.manifest.model.preprocess, folded=True)))
    runner = DeviceRunner(bundle, preprocess=FAST)
    x = runner.preprocess(next(iter(_photos(photos_dir).values())))
    sent, fields = runner.payload(OFFLOAD, x)
    assert sent.dtype == np.uint8 and sent.nbytes == 3 * 224 * 224 and fields == {"scale": 1.0, "zero_point": 0}
    np.testing.assert_array_equal(sent.astype(np.float32), x)  # the host's dequantize gives the input back
