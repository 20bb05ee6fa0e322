"""The memory check refuses what would run a board out of memory, with the numbers, and
accepts what fits."""

from __future__ import annotations

import math

import pytest

from boards import BOARDS, LOAD_FACTOR, SESSION_MB, BoardFitError, check_fits

MB = 2**20
#: VGG16 is a 528 MB file (138 M fp32 parameters, 470 MB of them in the classifier); a head
#: cut inside the classifier is nearly as big, and the full model rides along as the fallback.
VGG16_HEAD = {"head/classifier_3.onnx": 528 * MB, "full/model.onnx": 528 * MB}
MOBILENET_V2 = {"head/features_14_conv_2.onnx": 14 * MB, "full/model.onnx": 14 * MB}


def test_vgg16_head_is_refused_on_the_zero_2w_with_the_numbers() -> None:
    with pytest.raises(BoardFitError) as caught:
        check_fits(BOARDS["rpi-zero2w"], VGG16_HEAD)
    message = str(caught.value)
    assert message.startswith("head/classifier_3.onnx (528.0 MB → ~1182 MB loaded) with full/model.onnx (528.0 MB")
    assert "does not fit a Raspberry Pi Zero 2 W: needs ~2364 MB, 294 MB available" in message
    assert "(512 MB less ~218 MB for the OS and the runtime)" in message
    report = caught.value.report
    assert report.board.id == "rpi-zero2w" and report.spare_bytes < 0


@pytest.mark.parametrize("board", BOARDS, ids=list(BOARDS))
def test_a_mobilenet_v2_head_with_its_full_model_fits_every_board(board: str) -> None:
    report = check_fits(BOARDS[board], MOBILENET_V2)
    assert report.needed_bytes == 2 * math.ceil(14 * LOAD_FACTOR + SESSION_MB) * MB == 102 * MB
    assert report.spare_bytes > 150 * MB


def test_the_largest_artifact_leads_the_report() -> None:
    report = check_fits(BOARDS["rpi5-8gb"], {"full/model.onnx": 20 * MB, "head/a.onnx": 2 * MB, "head/b.onnx": 9 * MB})
    assert [a.name for a in report.artifacts] == ["full/model.onnx", "head/b.onnx", "head/a.onnx"]


def test_a_model_that_fits_the_8gb_pi_4_may_not_fit_the_2gb_one() -> None:
    check_fits(BOARDS["rpi4-8gb"], VGG16_HEAD)
    with pytest.raises(BoardFitError, match="does not fit a Raspberry Pi 4 Model B \\(2 GB\\)"):
        check_fits(BOARDS["rpi4-2gb"], VGG16_HEAD)


def test_nonsense_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no artifacts"):
        check_fits(BOARDS["rpi3b+"], {})
    with pytest.raises(ValueError, match="negative file size for head/x.onnx"):
        check_fits(BOARDS["rpi3b+"], {"head/x.onnx": -1})
