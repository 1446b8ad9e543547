"""Write a PNG grid of a trained CycleGAN's translations on held-out shape scenes.

Each row: real A (random colours), A -> B, real B (class palette), B -> A.

    python examples/cyclegan_grid.py --output-dir runs/q_cyclegan \
        --png docs/img/cyclegan_shapes_grid.png

Loads the run the way ``hotloop eval`` does (``find_checkpoint`` + ``load_trained``)
and draws one batch of the ``test`` split with ``hotloop.models.cyclegan.translation_grid``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from hotloop.models.cyclegan import translation_grid, write_png
from hotloop.compose.restore import find_checkpoint, load_trained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True, help="run directory of `hotloop train`")
    parser.add_argument("--which", choices=("latest", "best"), default="latest",
                        help="checkpoint (default latest: a GAN's eval loss does not rank quality)")
    parser.add_argument("--png", default="docs/img/cyclegan_shapes_grid.png")
    parser.add_argument("--split", default="test")
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--scale", type=int, default=2, help="nearest-neighbour upscaling factor")
    parser.add_argument("--bits", type=int, default=5,
                        help="bits kept per colour channel (the scenes' pixel noise does not compress)")
    args = parser.parse_args()

    path = find_checkpoint(args.output_dir, which=args.which)
    run = load_trained(path)
    hp = run.hp.replace(batch_size=max(args.rows, 1))
    batch = next(iter(run.problem.reader(args.split, hp, shuffle=False)))
    device = next(run.model.parameters()).device
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    grid = translation_grid(run.model, batch, rows=args.rows)                   # uint8 [R*H, 4*W, 3]
    grid = grid & (0xFF << (8 - args.bits) & 0xFF)                              # keep the top bits
    if args.scale > 1:
        grid = grid.repeat_interleave(args.scale, dim=0).repeat_interleave(args.scale, dim=1)
    out = Path(args.png)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_png(out, grid)
    print(f"{path} -> {out} ({grid.shape[1]}x{grid.shape[0]} px, {out.stat().st_size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
