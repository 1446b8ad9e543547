"""DeepLabV3+: shapes, output stride, parameter count, IoU statistics and a short overfit run."""
import numpy as np
import pytest
import torch

from hotloop.models.deeplab import DeepLabHParams, DeepLabV3Plus, deeplabv3plus_r50, segmentation_stats
from hotloop.models.resnet import ResNetBackbone, count_parameters
from hotloop.problems.base import ProblemSpec

pytestmark = pytest.mark.usefixtures("one_thread")   # the shared fixture of tests/conftest.py



def _spec(classes):
    return ProblemSpec(task="segment", input_vocab_size=0, target_vocab_size=classes, pad_id=-1)


def _tiny(**over):
    base = dict(image_size=32, stem="small", stem_stride=2, stem_channels=8, backbone_blocks=(1, 1, 1),
                backbone_width=4, backbone_channels=8, output_stride=4, aspp_rates=(1, 2),
                aspp_channels=8, low_level_channels=4, decoder_channels=8, batch_size=4)
    return DeepLabHParams(**{**base, **over})


def test_forward_backward_shapes():
    torch.manual_seed(0)
    model = DeepLabV3Plus(_tiny(), _spec(3))
    x = torch.randn(2, 3, 32, 24, requires_grad=True)
    out = model.loss({"inputs": x, "targets": torch.randint(0, 3, (2, 32, 24))}, with_accuracy=True)
    assert out.logits.shape == (2, 3, 32, 24)
    out.loss.backward()
    assert x.grad is not None and all(p.grad is not None for p in model.parameters())
    assert int(out.stats["tokens"]) == 2 * 32 * 24


@pytest.mark.parametrize("output_stride, strides, dilations, size", [
    (16, (1, 1, 2, 2, 1), (1, 1, 1, 1, 2), 513 // 16 + 1),
    (8, (1, 1, 2, 1, 1), (1, 1, 1, 2, 4), 513 // 8 + 1)])
def test_atrous_backbone_keeps_the_output_stride(output_stride, strides, dilations, size):
    hp = deeplabv3plus_r50().replace(output_stride=output_stride)
    with torch.device("meta"):
        model = DeepLabV3Plus(hp, _spec(21))
        features = model.backbone(torch.empty(1, 3, 513, 513))
    first_blocks = [stage[0].spatial[0] for stage in model.backbone.stages]
    assert [c.stride[0] for c in first_blocks] == list(strides[1:])
    last_blocks = [stage[-1].spatial[0] for stage in model.backbone.stages]
    assert [c.dilation[0] for c in last_blocks] == list(dilations[1:])
    assert tuple(features[0].shape) == (1, 256, 129, 129)          # low-level features, stride 4
    assert tuple(features[-1].shape) == (1, 2048, size, size)


def test_parameter_count_matches_resnet50_plus_the_head():
    hp = deeplabv3plus_r50()
    backbone = count_parameters(lambda: ResNetBackbone(
        in_channels=3, stem="imagenet", stem_channels=64, blocks=(3, 4, 6, 3), widths=(64, 128, 256, 512),
        out_channels=(256, 512, 1024, 2048), strides=(1, 2, 2, 1), dilations=(1, 1, 1, 2)))
    assert backbone == 25_557_032 - (2048 * 1000 + 1000)   # torchvision's resnet50 without its classifier

    def conv_bn(cin, cout, k):
        return cin * cout * k * k + 2 * cout

    aspp = conv_bn(2048, 256, 1) * 2 + 3 * conv_bn(2048, 256, 3) + conv_bn(5 * 256, 256, 1)
    decoder = conv_bn(256, 48, 1) + conv_bn(304, 256, 3) + conv_bn(256, 256, 3) + 256 * 21 + 21
    total = count_parameters(lambda: DeepLabV3Plus(hp, _spec(21)))
    assert total == backbone + aspp + decoder == 40_352_181     # about 40M, as usually quoted for R50


def _reference_iou(pred, target, classes):
    valid = (target >= 0) & (target < classes)
    inter = [int(((pred == c) & (target == c) & valid).sum()) for c in range(classes)]
    union = [int((((pred == c) & valid) | (target == c)).sum()) for c in range(classes)]
    return inter, union


def test_segmentation_stats_match_a_brute_force_reference():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 4, 5, 6, generator=gen)
    target = torch.randint(0, 4, (2, 5, 6), generator=gen)
    target[0, 0, :3] = 255                                          # ignored ("void") pixels
    loss, stats = segmentation_stats(logits, target, with_accuracy=True)
    pred = logits.argmax(1).numpy()
    t = target.numpy()
    inter, union = _reference_iou(pred, t, 4)
    assert [int(stats[f"inter_{c}"]) for c in range(4)] == inter
    assert [int(stats[f"union_{c}"]) for c in range(4)] == union
    valid = t != 255
    assert int(stats["tokens"]) == valid.sum() and int(stats["correct"]) == ((pred == t) & valid).sum()
    logp = torch.log_softmax(logits, 1).permute(0, 2, 3, 1).numpy()  # [B, H, W, K]
    nll = -np.take_along_axis(logp, np.where(valid, t, 0)[..., None], -1)[..., 0][valid]
    assert float(loss) == pytest.approx(nll.mean(), rel=1e-5)
    assert float(stats["nll_sum"]) == pytest.approx(nll.sum(), rel=1e-5)


def test_bad_output_stride_is_rejected():
    with pytest.raises(ValueError, match="output_stride"):
        DeepLabV3Plus(_tiny(output_stride=1), _spec(3))


def test_short_run_overfits_a_batch():
    torch.manual_seed(0)
    model = DeepLabV3Plus(_tiny(), _spec(3))
    coarse = torch.randn(4, 3, 4, 4)
    x = coarse.repeat_interleave(8, 2).repeat_interleave(8, 3)      # [4, 3, 32, 32], 8x8 blocks
    target = (x[:, 0] > 0.3).long() + (x[:, 1] > 0.3).long()       # a per-block rule of the input
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(20):
        loss = model.loss({"inputs": x, "targets": target}).loss
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first
