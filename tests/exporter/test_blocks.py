"""DSC's block-level view: cut points grouped into the model's blocks, counted where the paper counts."""

from __future__ import annotations

import pytest

from exporter._blocks import block_units, count_blocks
from exporter.cli import main


def test_residual_blocks_are_one_unit_and_containers_open(random_model) -> None:
    loaded, traced, cuts = random_model("resnet18")
    units = block_units(loaded.module)
    assert traced.blocks == tuple(units)
    assert units[:5] == ["conv1", "bn1", "relu", "maxpool", "layer1.0"] and "layer4.1" in units and "layer1" not in units
    inside = [c for c in cuts if c.block == "layer2.0"]
    assert inside and [c.block_output for c in inside] == [False] * (len(inside) - 1) + [True]
    counts = count_blocks(cuts)
    assert (counts.cut_points, counts.natural, counts.compressive) == (22, 14, 4)
    assert (counts.blocks, counts.block_cut_points, counts.block_natural, counts.block_compressive) == (14, 14, 8, 4)
    assert [c.id for c in cuts if c.block_compressive] == ["layer2_0_relu_1", "layer3_0_relu_1", "layer4_0_relu_1",
                                                            "avgpool"]


@pytest.mark.parametrize("name, operator_natural, blocks, block_natural", [
    ("efficientnet_b0", 56, 21, 19),  # 16 MBConv blocks, the stem, the head conv, pooling, the classifier
    ("mobilenet_v2", 52, 22, 20),
])
def test_operator_counting_inflates_what_the_block_view_counts(random_model, name, operator_natural, blocks,
                                                               block_natural) -> None:
    _, _, cuts = random_model(name)
    counts = count_blocks(cuts)
    assert (counts.natural, counts.blocks, counts.block_natural) == (operator_natural, blocks, block_natural)
    assert counts.block_compressive == counts.compressive == 5


def test_points_prints_the_block_summary_and_marks_block_outputs(capsys) -> None:
    assert main(["points", "torchvision:resnet18"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == ("22 cut points: 14 natural, 4 compressive; at block level (14 blocks, as DSC counts): "
                         "14 cut points, 8 natural, 4 compressive")
    # Compressive at block level (*) though not among every operator cut (no C): a cut inside layer2.0 is smaller.
    assert next(line for line in lines if line.startswith("layer2_0_relu_1 ")).split()[-1] == "NB*"
