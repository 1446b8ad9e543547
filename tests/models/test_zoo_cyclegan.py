"""CycleGAN: shapes, published parameter counts, the image pool, phase gradients, a short run."""
import pytest
import torch

from hotloop.engine import Strategy, build_step
from hotloop.models.cyclegan import (CycleGAN, CycleGANHParams, ImagePool, PatchDiscriminator, ResnetGenerator,
                                     translation_grid, write_png)
from hotloop.models.resnet import count_parameters
from hotloop.problems.base import ProblemSpec

pytestmark = pytest.mark.usefixtures("one_thread")   # the shared fixture of tests/conftest.py



SPEC = ProblemSpec(task="image2image", input_vocab_size=0, target_vocab_size=3, pad_id=-1)


def _tiny(**over):
    base = dict(image_size=16, gen_filters=4, gen_blocks=1, disc_filters=4, disc_layers=2, pool_size=3,
                batch_size=2)
    return CycleGANHParams(**{**base, **over})


def _batch(seed, b=2, size=16):
    gen = torch.Generator().manual_seed(seed)
    return {"inputs": torch.rand(b, 3, size, size, generator=gen) * 2 - 1,
            "targets": torch.rand(b, 3, size, size, generator=gen) * 2 - 1}


def test_published_parameter_counts_and_patch_size():
    # the reference implementation prints 11.378 M per generator and 2.765 M per discriminator
    assert count_parameters(lambda: ResnetGenerator(3, 64, 9)) == 11_378_179
    assert count_parameters(lambda: PatchDiscriminator(3, 64, 3)) == 2_764_737
    with torch.device("meta"):
        scores = PatchDiscriminator(3, 64, 3)(torch.empty(1, 3, 256, 256))
        fake = ResnetGenerator(3, 64, 9)(torch.empty(1, 3, 256, 256))
    assert scores.shape == (1, 1, 30, 30) and fake.shape == (1, 3, 256, 256)
    # receptive field of one score, layer by layer (kernel, stride): 70x70
    rf, jump = 1, 1
    for kernel, stride in [(4, 2), (4, 2), (4, 2), (4, 1), (4, 1)]:
        rf, jump = rf + (kernel - 1) * jump, jump * stride
    assert rf == 70


def test_shapes_and_phase_gradients():
    torch.manual_seed(0)
    model = CycleGAN(_tiny(), SPEC)
    batch = _batch(0)
    fake, _ = model(batch)
    assert fake.shape == (2, 3, 16, 16) and fake.abs().max() <= 1
    groups = model.parameter_groups()
    assert sum(len(g) for g in groups.values()) == len(list(model.parameters()))
    out = model.generator_loss(batch)
    out.loss.backward()
    assert all(p.grad is not None for p in groups["generator"])
    assert {"gan_sum", "cycle_sum", "identity_sum", "nll_sum", "examples"} <= set(out.stats)
    model.zero_grad(set_to_none=True)
    d = model.discriminator_loss(batch)
    d.loss.backward()
    assert all(p.grad is None for p in groups["generator"])      # fakes are detached
    assert all(p.grad is not None for p in groups["discriminator"])


def test_discriminator_phase_scores_the_fakes_of_its_own_micro_batch():
    torch.manual_seed(0)
    model = CycleGAN(_tiny(pool_size=0), SPEC)
    first, second = _batch(1), _batch(2)
    with torch.no_grad():
        fake_b = model.a_to_b(first["inputs"])
        fake_a = model.b_to_a(first["targets"])
        expected = sum(0.5 * (((disc(real) - 1) ** 2).mean() + (disc(fake) ** 2).mean())
                       for disc, real, fake in ((model.disc_a, first["inputs"], fake_a),
                                                (model.disc_b, first["targets"], fake_b)))
    model.generator_loss(first)
    model.generator_loss(second)                                   # two micro-batches, then D
    torch.testing.assert_close(model.discriminator_loss(first).loss.detach(), expected)
    assert [entry[0] is second["inputs"] for entry in model._fakes] == [True]


def test_image_pool_keeps_history_and_swaps_half():
    torch.manual_seed(0)
    pool = ImagePool(3, (1, 1, 1))
    first = pool.query(torch.arange(3.0).view(3, 1, 1, 1))
    assert first.flatten().tolist() == [0, 1, 2] and int(pool.filled) == 3
    swapped = 0
    for step in range(200):
        image = torch.full((1, 1, 1, 1), 10.0 + step)
        before = set(pool.images.flatten().tolist())
        out = float(pool.query(image))
        after = set(pool.images.flatten().tolist())
        if out == 10.0 + step:                                     # passed through, pool unchanged
            assert after == before
        else:                                                      # an old image out, the new one in
            swapped += 1
            assert out in before and after == (before - {out}) | {10.0 + step}
    assert 70 < swapped < 130
    state = pool.state_dict()
    assert set(state) == {"images", "filled"}                      # checkpoints carry the pool


def test_short_run_reduces_the_cycle_loss():
    torch.manual_seed(0)
    model = CycleGAN(_tiny(), SPEC)
    groups = model.parameter_groups()
    opt_g = torch.optim.Adam(groups["generator"], lr=2e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(groups["discriminator"], lr=2e-3, betas=(0.5, 0.999))
    coarse = torch.rand(2, 3, 4, 4) * 2 - 1
    batch = {"inputs": coarse.repeat_interleave(4, 2).repeat_interleave(4, 3),
             "targets": -coarse.flip(1).repeat_interleave(4, 2).repeat_interleave(4, 3)}
    cycles = []
    for _ in range(40):
        opt_g.zero_grad(set_to_none=True)
        out = model.generator_loss(batch)
        out.loss.backward()
        opt_g.step()
        opt_d.zero_grad(set_to_none=True)
        model.discriminator_loss(batch).loss.backward()
        opt_d.step()
        cycles.append(float(out.stats["cycle_sum"]) / 2)
    assert max(cycles[-3:]) < 0.6 * cycles[0]


def test_translation_grid_png(tmp_path):
    import matplotlib.image as matplotlib_image
    torch.manual_seed(0)
    model = CycleGAN(_tiny(), SPEC)
    batch = _batch(1, b=3)
    grid = translation_grid(model, batch, rows=2)
    assert grid.shape == (32, 64, 3) and grid.dtype == torch.uint8
    expected_a = ((batch["inputs"][1] + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0)
    assert torch.equal(grid[16:, :16], expected_a)                  # row 2, column "real A"
    path = write_png(tmp_path / "grid.png", grid)
    decoded = matplotlib_image.imread(str(path))                    # an independent PNG decoder
    assert decoded.shape == (32, 64, 3)
    assert torch.equal(torch.from_numpy((decoded * 255).round().astype("uint8")), grid)


def _built_steps(strategy: Strategy) -> tuple[CycleGAN, list[dict[str, float]]]:
    torch.manual_seed(0)
    model = CycleGAN(_tiny(), SPEC)
    step = build_step(model, _tiny(), strategy).step
    torch.manual_seed(1)                                           # the pools' draws
    return model, [{k: float(v) for k, v in step([_batch(seed)]).stats.items()} for seed in (1, 2, 3)]


def test_a_channels_last_step_scores_the_fakes_its_generator_phase_made():
    """The step converts an NCHW batch once, before both phases: the discriminator phase finds the
    generator phase's fakes (none is left behind) and the step trains as the contiguous one does."""
    model, stats = _built_steps(Strategy(channels_last=True))
    assert model._fakes == []
    _, contiguous = _built_steps(Strategy())
    assert stats[0].keys() == contiguous[0].keys() and any(k.startswith("discriminator/") for k in stats[0])
    for got, want in zip(stats, contiguous):
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
