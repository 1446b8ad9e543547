"""RoIAlign (both formulations) forward against a brute-force per-sample loop; backward by gradcheck."""
from __future__ import annotations

import pytest
import torch

from hotloop.ops import ROI_ALIGN_FORMULATIONS, fpn_levels, multiscale_roi_align, roi_align

from ops_refs import roi_align_ref


def _rois(gen: torch.Generator, k: int, n: int, size: float) -> torch.Tensor:
    xy = torch.rand(k, 2, generator=gen, dtype=torch.float64) * size - 2      # some start outside
    wh = 0.3 + torch.rand(k, 2, generator=gen, dtype=torch.float64) * size * 0.7
    batch = torch.randint(0, n, (k, 1), generator=gen).to(torch.float64)
    return torch.cat((batch, xy, xy + wh), dim=1)


@pytest.mark.parametrize("formulation", ROI_ALIGN_FORMULATIONS)
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("sampling_ratio", [2, 1, 0])
def test_roi_align_matches_reference(device, aligned, sampling_ratio, formulation):
    gen = torch.Generator().manual_seed(sampling_ratio + 10 * aligned)
    features = torch.randn(2, 3, 9, 11, generator=gen, dtype=torch.float64)
    rois = _rois(gen, 6, 2, size=20.0)                       # scale 0.5 -> up to ~10 px on the map
    want = roi_align_ref(features, rois, 3, 4, 0.5, sampling_ratio, aligned)
    got = roi_align(features.to(device), rois.to(device), (3, 4), 0.5, sampling_ratio, aligned,
                    formulation=formulation).cpu()
    assert torch.allclose(got, want, atol=1e-10)


def test_roi_align_hand_value():
    # a linear ramp f(y, x) = x is reproduced exactly at bin centres inside the map
    features = torch.arange(8, dtype=torch.float64).repeat(1, 1, 8, 1)      # [1, 1, 8, 8]
    rois = torch.tensor([[0.0, 2.0, 2.0, 6.0, 6.0]], dtype=torch.float64)
    out = roi_align(features, rois, 2, 1.0, 2, aligned=True)
    # aligned: the box spans map x in [1.5, 5.5]; bin centres 2.5 and 4.5
    assert torch.allclose(out[0, 0], torch.tensor([[2.5, 4.5], [2.5, 4.5]], dtype=torch.float64))


@pytest.mark.parametrize("formulation", ROI_ALIGN_FORMULATIONS)
def test_roi_align_gradcheck(device, formulation):
    gen = torch.Generator().manual_seed(5)
    features = torch.randn(2, 2, 5, 6, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    rois = _rois(gen, 3, 2, size=6.0).to(device)
    for sampling_ratio in (2, 0):
        assert torch.autograd.gradcheck(
            lambda f: roi_align(f, rois, 2, 1.0, sampling_ratio, True, formulation=formulation), (features,))


def test_the_separable_formulation_matches_the_gather_one_in_fp32_and_bf16():
    """The same bins in another summation order: fp32 within reordering, and under bf16 features
    (autocast's dtype) within bf16 rounding; no regions gives an empty result."""
    gen = torch.Generator().manual_seed(7)
    features = torch.randn(3, 8, 16, 16, generator=gen)
    rois = _rois(gen, 40, 3, size=60.0).float()
    want = roi_align(features, rois, 7, 0.25)
    assert torch.allclose(roi_align(features, rois, 7, 0.25, formulation="separable"), want, rtol=1e-5, atol=1e-6)
    half = roi_align(features.bfloat16(), rois, 7, 0.25, formulation="separable")
    assert half.dtype == torch.bfloat16 and torch.allclose(half.float(), want, rtol=0.05, atol=0.05)
    assert roi_align(features, rois[:0], 7, 0.25, formulation="separable").shape == (0, 8, 7, 7)
    with pytest.raises(ValueError, match="gather"):
        roi_align(features, rois, 7, 0.25, formulation="dense")


def test_fpn_levels_and_multiscale():
    boxes = torch.tensor([[0, 0, 224, 224], [0, 0, 112, 112], [0, 0, 10, 10], [0, 0, 900, 900.]])
    assert fpn_levels(boxes, 2, 5).tolist() == [4, 3, 2, 5]
    gen = torch.Generator().manual_seed(6)
    feats = [torch.randn(1, 2, 32 // s, 32 // s, generator=gen, dtype=torch.float64) for s in (4, 8)]
    rois = torch.tensor([[0, 0, 0, 8, 8], [0, 0, 0, 30, 30]], dtype=torch.float64)
    out = multiscale_roi_align(feats, rois, 2, [4, 8], canonical_size=16.0, canonical_level=3)
    # level 2 (stride 4) for the 8 px box, level 3 (stride 8) for the 30 px box
    assert torch.allclose(out[0], roi_align(feats[0], rois[:1], 2, 0.25)[0])
    assert torch.allclose(out[1], roi_align(feats[1], rois[1:], 2, 0.125)[0])
    separable = multiscale_roi_align(feats, rois, 2, [4, 8], canonical_size=16.0, canonical_level=3,
                                     formulation="separable")
    assert torch.allclose(separable, out, atol=1e-12)
