"""SE-ResNeXt: shapes, the published parameter counts, SE gating and a short overfit run."""
import pytest
import torch

from hotloop.models.resnet import Bottleneck, ResNetBackbone, count_parameters
from hotloop.models.se_resnext import SEResNeXt, SEResNeXtHParams, se_resnext50_imagenet, se_resnext_small
from hotloop.problems.base import ProblemSpec

pytestmark = pytest.mark.usefixtures("one_thread")   # the shared fixture of tests/conftest.py



def _spec(classes):
    return ProblemSpec(task="classify", input_vocab_size=0, target_vocab_size=classes,
                       max_input_length=0, max_target_length=1, pad_id=-1)


def _tiny(**over):
    base = dict(image_channels=1, image_size=16, stem="small", stem_channels=8, stage_blocks=(1, 1),
                cardinality=2, group_width=4, stage_channels=16, se_reduction=4, batch_size=8)
    return SEResNeXtHParams(**{**base, **over})


def test_forward_backward_shapes():
    torch.manual_seed(0)
    model = SEResNeXt(_tiny(), _spec(5))
    x = torch.randn(3, 1, 16, 16, requires_grad=True)
    out = model.loss({"inputs": x, "targets": torch.tensor([[0], [4], [2]])}, with_accuracy=True)
    assert out.logits.shape == (3, 1, 5)
    out.loss.backward()
    assert x.grad is not None and all(p.grad is not None for p in model.parameters())
    assert int(out.stats["tokens"]) == 3 and 0 <= int(out.stats["correct"]) <= 3


def test_full_size_shapes_on_meta():
    with torch.device("meta"):
        model = SEResNeXt(se_resnext50_imagenet(), _spec(1000))
        features = model.body(torch.empty(2, 3, 224, 224))
        logits = model.top(features[-1].mean(dim=(2, 3)))
    assert logits.shape == (2, 1000)
    assert [tuple(f.shape[1:]) for f in features] == [(256, 56, 56), (512, 28, 28), (1024, 14, 14),
                                                      (2048, 7, 7)]


def _se_params(channels, reduction):
    hidden = channels // reduction
    return channels * hidden + hidden + hidden * channels + channels


def test_parameter_counts_match_published_models():
    hp = se_resnext50_imagenet()
    # torchvision's resnet50 / resnext50_32x4d (1000 classes) have 25,557,032 / 25,028,904 parameters
    assert count_parameters(lambda: SEResNeXt(hp.replace(se_reduction=0, cardinality=1, group_width=64),
                                              _spec(1000))) == 25_557_032
    plain = count_parameters(lambda: SEResNeXt(hp.replace(se_reduction=0), _spec(1000)))
    assert plain == 25_028_904
    # SE adds two FC layers per block; Hu et al. report 27.5M for SE-ResNeXt-50 (timm: 27.56M)
    se = sum(n * _se_params(256 * 2 ** i, 16) for i, n in enumerate(hp.stage_blocks))
    total = count_parameters(lambda: SEResNeXt(hp, _spec(1000)))
    assert total == plain + se == 27_559_896
    assert count_parameters(lambda: SEResNeXt(se_resnext_small(), _spec(10))) < 400_000


def test_squeeze_excitation_gates_channels():
    torch.manual_seed(0)
    block = Bottleneck(8, 8, 8, se_reduction=4).eval()
    x = torch.randn(2, 8, 6, 6)
    branch = block.expand(block.spatial(block.reduce(x)))
    gate = torch.sigmoid(block.gate.expand(torch.relu(block.gate.reduce(branch.mean((2, 3), keepdim=True)))))
    torch.testing.assert_close(block(x), torch.relu(branch * gate + x))


def test_backbone_rejects_mismatched_stage_lists():
    with pytest.raises(ValueError, match="one entry per stage"):
        ResNetBackbone(in_channels=3, stem="small", stem_channels=8, blocks=(1, 1), widths=(8,),
                       out_channels=(8, 16), strides=(1, 2))


def test_short_run_overfits_a_batch():
    torch.manual_seed(0)
    model = SEResNeXt(_tiny(), _spec(4))
    batch = {"inputs": torch.randn(16, 1, 16, 16), "targets": torch.randint(0, 4, (16, 1))}
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    first = None
    for _ in range(20):
        loss = model.loss(batch).loss
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1 * first
