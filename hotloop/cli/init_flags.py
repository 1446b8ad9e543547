"""``hotloop train``'s ``--init-from`` flags (:mod:`hotloop.train.init_from`): parsed, read and
checked before the run writes anything."""
from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_init_arguments", "init_overrides", "read_init"]


def add_init_arguments(parser: argparse.ArgumentParser) -> None:
    """``--init-from``, ``--init-strict``, ``--init-hparams-from-config``."""
    parser.add_argument("--init-from", default=None, metavar="PATH",
                        help="initialise the weights from a hotloop checkpoint or run directory, a safetensors "
                             "export or a Hugging Face BERT directory (a fresh run: step 0, new optimizer)")
    parser.add_argument("--init-strict", action="store_true", default=None,
                        help="--init-from must fill every tensor of the model exactly (default: load what fits "
                             "and list the rest)")
    parser.add_argument("--init-hparams-from-config", action="store_true", default=None,
                        help="take bert's sizes, activation and dropout from the --init-from directory's "
                             "config.json (--override still wins)")


def init_overrides(args: argparse.Namespace, overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` over the ``--init-from`` config's hparams when ``--init-hparams-from-config``."""
    from ..train.init_from import hf_hparams
    if args.init_from and args.init_hparams_from_config:
        return {**hf_hparams(args.init_from), **overrides}
    return overrides


def read_init(args: argparse.Namespace, hp: Any) -> Any:
    """The ``--init-from`` weights (None without the flag), read and checked against ``hp``."""
    from ..train.init_from import check_init_sizes, read_init_weights
    if not args.init_from:
        return None
    weights = read_init_weights(args.init_from)
    check_init_sizes(weights, hp)
    return weights
