"""CycleGAN (Zhu et al., 2017): unpaired image translation (``task="image2image"``).

Two ResNet generators (``c7s1-64, d128, d256, R256 x N, u128, u64, c7s1-3``:
reflection padding, instance norm, tanh output), two 70x70 PatchGAN
discriminators (``C64-C128-C256-C512`` 4x4 convs, LeakyReLU 0.2, then a 1-channel
conv), the least-squares GAN loss, cycle-consistency (L1, weight
``lambda_cycle``) and identity losses (L1, weight ``lambda_identity *
lambda_cycle``), and a pool of ``pool_size`` earlier fakes per domain from
which the discriminators see half of their fake inputs. The pools are
buffers, so checkpoints carry them.

The two updates are separate phases: :meth:`CycleGAN.generator_loss` (its
backward also reaches the discriminators' parameters: zero their gradients
before the discriminator phase) and :meth:`CycleGAN.discriminator_loss`,
which scores the fakes of the latest generator phase (through the pools);
:meth:`CycleGAN.parameter_groups` names the parameters of each optimizer.
Batches: ``inputs`` (domain A) and ``targets`` (domain B), ``[B, 3, H, W]`` in [-1, 1].
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hparams import HParamsError
from ..problems.base import Batch, ProblemSpec
from ..problems.shapes_unpaired import UnpairedShapesHParams
from ..registry import hparams_sets, models
from .base import LossOutput, SequenceModel, count

__all__ = ["CycleGAN", "CycleGANHParams", "ResnetGenerator", "PatchDiscriminator", "ImagePool",
           "translation_grid", "write_png", "cyclegan_256", "cyclegan_small"]

_MAX_CACHED = 8   # generator-phase fakes kept for the discriminator phase (micro-batches)


@dataclass(frozen=True)
class CycleGANHParams(UnpairedShapesHParams):
    gen_filters: int = 64          # c7s1-<gen_filters>; the two downsamplings double it twice
    gen_blocks: int = 9            # residual blocks (9 at 256 px, 6 at 128 px)
    disc_filters: int = 64
    disc_layers: int = 3           # strided C-blocks after the first (3 gives the 70x70 receptive field)
    lambda_cycle: float = 10.0
    lambda_identity: float = 0.5   # times lambda_cycle
    pool_size: int = 50


def _conv_in_relu(in_ch: int, out_ch: int, kernel: int, stride: int = 1, *,
                  reflect: int = 0) -> list[nn.Module]:
    """[reflection pad] -> conv (with bias) -> instance norm -> ReLU."""
    pad = [nn.ReflectionPad2d(reflect)] if reflect else []
    return pad + [nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=0 if reflect else kernel // 2),
                  nn.InstanceNorm2d(out_ch), nn.ReLU(inplace=True)]


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_in_relu(channels, channels, 3, reflect=1), nn.ReflectionPad2d(1),
                                  nn.Conv2d(channels, channels, 3), nn.InstanceNorm2d(channels))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x)


class ResnetGenerator(nn.Module):
    """[B, C, H, W] -> [B, C, H, W] in [-1, 1] (H, W multiples of 4)."""

    def __init__(self, channels: int, filters: int, blocks: int) -> None:
        super().__init__()
        f = filters
        layers = _conv_in_relu(channels, f, 7, reflect=3)                           # c7s1-f
        layers += _conv_in_relu(f, 2 * f, 3, 2) + _conv_in_relu(2 * f, 4 * f, 3, 2)  # d2f, d4f
        layers += [_ResidualBlock(4 * f) for _ in range(blocks)]                     # R4f x N
        for in_ch, out_ch in ((4 * f, 2 * f), (2 * f, f)):                           # u2f, uf
            layers += [nn.ConvTranspose2d(in_ch, out_ch, 3, stride=2, padding=1, output_padding=1),
                       nn.InstanceNorm2d(out_ch), nn.ReLU(inplace=True)]
        layers += [nn.ReflectionPad2d(3), nn.Conv2d(f, channels, 7), nn.Tanh()]      # c7s1-C
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class PatchDiscriminator(nn.Module):
    """[B, C, H, W] -> [B, 1, h, w] real/fake scores, one per (70x70 with 3 layers) patch."""

    def __init__(self, channels: int, filters: int, layers: int) -> None:
        super().__init__()
        blocks: list[nn.Module] = [nn.Conv2d(channels, filters, 4, 2, 1), nn.LeakyReLU(0.2, inplace=True)]
        ch = filters
        for i in range(1, layers + 1):
            out = filters * min(2 ** i, 8)
            blocks += [nn.Conv2d(ch, out, 4, 2 if i < layers else 1, 1), nn.InstanceNorm2d(out),
                       nn.LeakyReLU(0.2, inplace=True)]
            ch = out
        blocks.append(nn.Conv2d(ch, 1, 4, 1, 1))
        self.net = nn.Sequential(*blocks)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class ImagePool(nn.Module):
    """Shrivastava et al.'s history of fakes, on the device and without host syncs.

    While not full, each image is stored and returned; then, with probability 1/2,
    an image replaces a random stored one, which is returned in its place.
    """

    def __init__(self, size: int, shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.size = size
        self.register_buffer("images", torch.zeros(size, *shape))          # [N, C, H, W]
        self.register_buffer("filled", torch.zeros((), dtype=torch.int64))

    @torch.no_grad()
    def query(self, images: Tensor) -> Tensor:
        if self.size == 0:
            return images
        out = []
        for image in images:                                                # [C, H, W]
            not_full = self.filled < self.size
            swap = ~not_full & (torch.rand((), device=image.device) < 0.5)
            slot = torch.where(not_full, self.filled,
                               torch.randint(self.size, (), device=image.device))
            old = self.images[slot]
            out.append(torch.where(swap, old, image))
            self.images[slot] = torch.where(not_full | swap, image.to(old.dtype), old)
            self.filled += not_full.long()
        return torch.stack(out)


@models.register("cyclegan")
class CycleGAN(SequenceModel):
    """Generators ``a_to_b``/``b_to_a``, discriminators ``disc_a``/``disc_b``, pools of fakes."""

    tasks = ("image2image",)

    def __init__(self, hp: CycleGANHParams, spec: ProblemSpec) -> None:
        super().__init__(hp, spec)
        if not isinstance(hp, CycleGANHParams):
            raise HParamsError(f"cyclegan needs CycleGANHParams (e.g. --hparams cyclegan_small), "
                            f"got {type(hp).__name__}")
        c = hp.image_channels
        self.a_to_b = ResnetGenerator(c, hp.gen_filters, hp.gen_blocks)
        self.b_to_a = ResnetGenerator(c, hp.gen_filters, hp.gen_blocks)
        self.disc_a = PatchDiscriminator(c, hp.disc_filters, hp.disc_layers)
        self.disc_b = PatchDiscriminator(c, hp.disc_filters, hp.disc_layers)
        shape = (c, hp.image_size, hp.image_size)
        self.pool_a, self.pool_b = ImagePool(hp.pool_size, shape), ImagePool(hp.pool_size, shape)
        self._fakes: list[tuple[Tensor, Tensor, Tensor]] = []   # (real A, fake A, fake B) per batch
        for m in self.modules():                                            # N(0, 0.02) as the paper's code
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                nn.init.normal_(m.weight, 0.0, 0.02)
                nn.init.zeros_(m.bias)

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        gen = list(self.a_to_b.parameters()) + list(self.b_to_a.parameters())
        disc = list(self.disc_a.parameters()) + list(self.disc_b.parameters())
        return {"generator": gen, "discriminator": disc}

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        """The A -> B translation of ``inputs`` [B, C, H, W]."""
        return self.a_to_b(batch["inputs"]), None

    @staticmethod
    def _lsgan(scores: Tensor, real: bool) -> Tensor:
        return F.mse_loss(scores.float(), torch.full_like(scores, 1.0 if real else 0.0, dtype=torch.float32))

    def generator_loss(self, batch: Batch) -> LossOutput:
        hp = self.hp
        real_a, real_b = batch["inputs"], batch["targets"]                  # [B, C, H, W] each
        fake_b, fake_a = self.a_to_b(real_a), self.b_to_a(real_b)
        gan = self._lsgan(self.disc_b(fake_b), True) + self._lsgan(self.disc_a(fake_a), True)
        cycle = F.l1_loss(self.b_to_a(fake_b), real_a) + F.l1_loss(self.a_to_b(fake_a), real_b)
        loss = gan + hp.lambda_cycle * cycle
        n = real_a.shape[0]
        stats = {"gan_sum": gan.detach() * n, "cycle_sum": cycle.detach() * n}
        if hp.lambda_identity > 0:
            identity = F.l1_loss(self.a_to_b(real_b), real_b) + F.l1_loss(self.b_to_a(real_a), real_a)
            loss = loss + hp.lambda_cycle * hp.lambda_identity * identity
            stats["identity_sum"] = identity.detach() * n
        if self.training:   # for the discriminator phase of this batch (one per micro-batch)
            self._fakes = self._fakes[-(_MAX_CACHED - 1):] + [(real_a, fake_a.detach(), fake_b.detach())]
        stats.update(nll_sum=loss.detach() * n, tokens=count(n, real_a), examples=count(n, real_a))
        return LossOutput(loss, stats, None, fake_b)

    def discriminator_loss(self, batch: Batch) -> LossOutput:
        """LSGAN loss of both discriminators on real images and pooled fakes (those the
        generator phase made from this batch, or made now when there are none)."""
        real_a, real_b = batch["inputs"], batch["targets"]
        cached = [i for i, entry in enumerate(self._fakes) if entry[0] is real_a]
        if cached:
            _, fake_a, fake_b = self._fakes.pop(cached[0])
        else:
            with torch.no_grad():
                fake_a, fake_b = self.b_to_a(real_b), self.a_to_b(real_a)
        fake_a, fake_b = self.pool_a.query(fake_a), self.pool_b.query(fake_b)
        loss_a = 0.5 * (self._lsgan(self.disc_a(real_a), True) + self._lsgan(self.disc_a(fake_a), False))
        loss_b = 0.5 * (self._lsgan(self.disc_b(real_b), True) + self._lsgan(self.disc_b(fake_b), False))
        loss = loss_a + loss_b
        n = real_a.shape[0]
        return LossOutput(loss, {"disc_sum": loss.detach() * n, "examples": count(n, real_a)}, None, None)

    def loss(self, batch: Batch, state: Any = None, *, with_accuracy: bool = False) -> LossOutput:
        """The generator phase's loss (what evaluation reports as ``loss``)."""
        return self.generator_loss(batch)


@torch.no_grad()
def translation_grid(model: CycleGAN, batch: Batch, rows: int = 4) -> Tensor:
    """uint8 [rows * H, 4 * W, 3]: per row real A, A -> B, real B, B -> A (eval mode)."""
    was_training = model.training
    model.eval()
    try:
        real_a, real_b = batch["inputs"][:rows], batch["targets"][:rows]               # [R, C, H, W]
        columns = [real_a, model.a_to_b(real_a), real_b, model.b_to_a(real_b)]
    finally:
        model.train(was_training)
    grid = torch.cat([torch.cat(list(col), dim=1) for col in columns], dim=2)       # [C, R*H, 4*W]
    return ((grid.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).cpu()


def write_png(path: str | Path, image: Tensor) -> Path:
    """Write uint8 [H, W, 3] as an 8-bit RGB PNG (no imaging library needed)."""
    height, width, _ = image.shape
    rows = b"".join(b"\x00" + bytes(row) for row in image.contiguous().numpy().reshape(height, -1))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path = Path(path)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
                     + chunk(b"IEND", b""))
    return path


@hparams_sets.register("cyclegan_256")
def cyclegan_256() -> CycleGANHParams:
    """The published setting: 256 px, 9 residual blocks, 64 filters, batch 1, Adam 2e-4 (beta1 0.5),
    lambda 10 / identity 0.5, pool 50, 200 epochs (the paper decays the rate linearly after 100)."""
    return CycleGANHParams(image_size=256, batch_size=1, optimizer="adam", learning_rate=2e-4,
                           adam_beta1=0.5, adam_beta2=0.999, adam_epsilon=1e-8, max_epochs=200,
                           train_examples=1000)


@hparams_sets.register("cyclegan_small")
def cyclegan_small() -> CycleGANHParams:
    """64 px shape scenes on a small CPU: 16 filters, 3 residual blocks, batch 4."""
    return CycleGANHParams(image_size=64, gen_filters=16, gen_blocks=3, disc_filters=16, batch_size=4,
                           optimizer="adam", learning_rate=2e-4, adam_beta1=0.5, adam_beta2=0.999,
                           adam_epsilon=1e-8, max_steps=3000)
