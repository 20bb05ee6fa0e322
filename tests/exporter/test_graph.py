"""Cut-point analysis on real, non-sequential torchvision graphs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from exporter._graph import split_at  # noqa: E402
from splitedge.errors import CutPointError  # noqa: E402

# The cut after the logits is not counted: it is local-only inference, which every bundle
# already has as its full model.
CUT_COUNTS = {"resnet18": 22, "mobilenet_v2": 72, "efficientnet_b0": 78, "vgg16": 39}


@pytest.mark.parametrize("name,count", sorted(CUT_COUNTS.items()))
def test_cut_point_counts(name: str, count: int, random_model) -> None:
    _, traced, cuts = random_model(name)
    assert len(cuts) == count
    positions = [c.position for c in cuts]
    assert positions == sorted(positions)
    nodes = list(traced.module.graph.nodes)
    assert {nodes[0].name, nodes[-1].name, *(n.name for n in nodes[-1].all_input_nodes)}.isdisjoint(c.id for c in cuts)


def _position(nodes, predicate) -> int:
    return next(i for i, n in enumerate(nodes) if predicate(n))


def test_no_cut_inside_a_residual_block(random_model) -> None:
    _, traced, cuts = random_model("resnet18")
    nodes = list(traced.module.graph.nodes)
    cut_positions = {c.position for c in cuts}
    blocks = sorted({str(n.target).rsplit(".", 1)[0] for n in nodes if str(n.target).endswith(".conv1")})
    assert len(blocks) == 8
    for block in blocks:
        start = _position(nodes, lambda n: n.target == f"{block}.conv1")
        # The block's add is the one that reads its second batch norm.
        add = _position(nodes, lambda n: n.op == "call_function" and any(a.target == f"{block}.bn2" for a in n.all_input_nodes))
        assert not cut_positions & set(range(start, add)), block
        assert add in cut_positions  # right after the add, only the sum is live


def test_no_cut_inside_squeeze_excitation(random_model) -> None:
    _, traced, cuts = random_model("efficientnet_b0")
    nodes = list(traced.module.graph.nodes)
    cut_positions = {c.position for c in cuts}
    squeezes = [str(n.target).removesuffix(".avgpool") for n in nodes if str(n.target).endswith(".avgpool") and ".block." in str(n.target)]
    assert len(squeezes) == 16  # one per MBConv block
    for se in squeezes:
        start = _position(nodes, lambda n: n.target == f"{se}.avgpool")
        mul = _position(nodes, lambda n: any(a.target == f"{se}.scale_activation" for a in n.all_input_nodes))
        assert nodes[mul].name == f"{se.replace('.', '_')}_mul"  # named after the module that multiplies
        assert not cut_positions & set(range(start, mul)), se


def test_mobilenet_v2_compressive_bottlenecks(random_model) -> None:
    """DSC Eq. 3 by hand. Input 3x224x224 = 150,528 values; each block's projection
    (its ``conv_2``, before the batch norm of the same size) sets a new minimum when:
    features_2  24x56x56 = 75,264 (0.5)       features_4  32x28x28 = 25,088 (0.167)
    features_7  64x14x14 = 12,544 (0.083)     features_14 160x7x7  =  7,840 (0.052)
    pooling     1280     =  1,280 (0.0085)
    Not compressive: features_4's depthwise output 144x28x28 = 112,896 is natural (0.75)
    but larger than 75,264; features_11's projection 96x14x14 = 18,816 and features_17's
    320x7x7 = 15,680 are larger than the minimum already reached.
    """
    _, _, cuts = random_model("mobilenet_v2")
    compressive = [(c.id, c.shape) for c in cuts if c.compressive]
    assert compressive == [
        ("features_2_conv_2", (24, 56, 56)),
        ("features_4_conv_2", (32, 28, 28)),
        ("features_7_conv_2", (64, 14, 14)),
        ("features_14_conv_2", (160, 7, 7)),
        ("adaptive_avg_pool2d", (1280, 1, 1)),
    ]
    by_id = {c.id: c for c in cuts}
    assert by_id["features_2_conv_2"].compression_ratio == pytest.approx(0.5)
    assert by_id["features_4_conv_1_2"].natural and not by_id["features_4_conv_1_2"].compressive
    assert not by_id["features_7_conv_0_2"].natural  # 192x28x28 = 150,528: exactly the input size


def test_vgg16_compressive_bottlenecks(random_model) -> None:
    """Input 150,528 values. Every conv layer before pool4 is at least as large
    (512x28x28 = 401,408); pool4 (features_23) 512x14x14 = 100,352 (0.667);
    pool5 (features_30) 512x7x7 = 25,088 (0.167); the first fully connected layer
    (classifier_0) 4,096 (0.027). The 512x14x14 convs after pool4 are natural, not compressive.
    """
    _, _, cuts = random_model("vgg16")
    assert [c.id for c in cuts if c.compressive] == ["features_23", "features_30", "classifier_0"]
    assert [c.id for c in cuts if c.natural][:7] == [f"features_{i}" for i in range(23, 30)]
    assert {c.bytes_per_sample for c in cuts if c.compressive} == {100_352 * 4, 25_088 * 4, 4_096 * 4}


def test_head_parameters_grow_to_the_whole_feature_extractor(random_model) -> None:
    loaded, _, cuts = random_model("mobilenet_v2")
    classifier = sum(p.numel() for p in loaded.module.classifier.parameters())
    assert cuts[0].head_parameters == 32 * 3 * 3 * 3  # the first conv, no bias
    assert cuts[-1].head_parameters == sum(p.numel() for p in loaded.module.parameters()) - classifier


def test_split_halves_hold_only_their_own_weights(random_model) -> None:
    loaded, traced, cuts = random_model("vgg16")
    head, tail = split_at(traced, "features_30")
    assert sum(p.numel() for p in head.parameters()) == {c.id: c for c in cuts}["features_30"].head_parameters
    assert sum(p.numel() for p in head.parameters()) + sum(p.numel() for p in tail.parameters()) == sum(
        p.numel() for p in loaded.module.parameters()
    )
    x = torch.randn(2, *loaded.input_shape)
    with torch.no_grad():
        torch.testing.assert_close(tail(head(x)), loaded.module(x), atol=1e-4, rtol=0)


def test_unknown_cut_suggests_near_matches(random_model) -> None:
    _, traced, _ = random_model("resnet18")
    with pytest.raises(CutPointError, match=r"'layer1_0_relu_2' is not a valid cut point; did you mean layer1_0_relu_1"):
        split_at(traced, "layer1_0_relu_2")
    with pytest.raises(CutPointError, match=r"'layer1_0_conv2' is not a valid cut point.*valid cut points: conv1, bn1"):
        split_at(traced, "layer1_0_conv2")  # inside a residual block: exists in the graph, not a cut


def test_calls_are_named_after_the_module_that_makes_them(random_model) -> None:
    """``out += identity`` in ResNet's ``layer4.0`` is ``layer4_0_add``, not fx's ``add_6``; a call
    in the model's own forward keeps fx's name; an old fx id is pointed at the new ones."""
    _, traced, cuts = random_model("resnet18")
    assert [c.id for c in cuts if c.op == "add"] == [f"layer{i}_{b}_add" for i in (1, 2, 3, 4) for b in (0, 1)]
    assert [c.id for c in cuts if c.op == "flatten"] == ["flatten"]  # ResNet.forward's own torch.flatten
    with pytest.raises(CutPointError, match=r"'add_6' is not a valid cut point; did you mean layer1_0_add, .*layer4_0_add"):
        split_at(traced, "add_6")
    head, tail = split_at(traced, "layer4_0_add")
    x = torch.randn(2, *traced.input_shape)
    with torch.no_grad():
        torch.testing.assert_close(tail(head(x)), traced.module(x), atol=1e-4, rtol=0)
