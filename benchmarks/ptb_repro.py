"""Stand-alone PTB reproduction runner built from hotloop components.

Used while ``hotloop train`` (the Trainer/CLI) was not yet available: it wires
the same pieces the Trainer uses -- the ``ptb_lm`` problem reader, the
``lstm_lm`` model and hparams set, ``build_optimizer``/``build_schedule`` and
``build_step`` with a :class:`Strategy` -- into the Zaremba epoch loop:
train one epoch (state carried, detached every step), evaluate valid and test,
decay the learning rate per the schedule. Logs JSON lines to ``--out``.

    PYTHONPATH=. python benchmarks/ptb_repro.py --hparams lstm_lm_small --out /work/runs/ptb_small
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hotloop.builtin import declare_builtins
from hotloop.engine.build import build_step
from hotloop.engine.strategy import Strategy
from hotloop.hparams import get_hparams
from hotloop.schedules import build_schedule
from hotloop.registry import models, problems

__all__ = ["evaluate", "plot_log", "main"]


@torch.no_grad()
def evaluate(model: torch.nn.Module, reader) -> float:
    """Perplexity of ``model`` over one pass of a contiguous-stream reader.

    Always fp32 (full logits + ``F.cross_entropy``), whatever formulation trains.
    """
    model.eval()
    nll = torch.zeros((), dtype=torch.float64)
    tokens = 0
    state = None
    for batch in reader:
        if state is None:
            state = model.initial_state(batch["inputs"].shape[0], torch.device("cpu"))
        logits, state = model(batch, state)
        nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                               batch["targets"].reshape(-1), reduction="sum").double()
        tokens += batch["targets"].numel()
    model.train()
    return math.exp(nll.item() / max(tokens, 1))


def plot_log(log_path: str | Path, png_path: str | Path, title: str = "") -> None:
    """Loss curve from this runner's ``log.jsonl`` (train, valid/test per epoch) or from a
    ``hotloop train`` run's ``metrics.jsonl`` (train and valid rows)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(line) for line in Path(log_path).read_text().splitlines() if line.strip()]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if rows and "split" in rows[0]:   # a `hotloop train` metrics.jsonl
        epoch_of = {r["step"]: r["epoch"] for r in rows if r["split"] == "train"}
        per_epoch = max(epoch_of) / max(max(epoch_of.values()), 1)
        train = [(r["step"] / per_epoch, r["ppl"]) for r in rows if r["split"] == "train"]
        valid = [(r["step"] / per_epoch, r["ppl"]) for r in rows if r["split"] == "valid"]
        ax.plot(*zip(*train), lw=0.8, alpha=0.7, label="train (50-step windows)")
        ax.plot(*zip(*valid), ".-", lw=1.0, label="valid (every 500 steps)")
        epochs = []
    else:                             # benchmarks/ptb_repro.py's log.jsonl
        start = next((r for r in rows if r["event"] == "start"), None)
        steps_per_epoch = start["steps_per_epoch"] if start else 1
        train = [(r["step"] / steps_per_epoch, r["ppl"]) for r in rows if r["event"] == "train"]
        epochs = [r for r in rows if r["event"] == "epoch"]
        if train:
            ax.plot(*zip(*train), lw=0.8, alpha=0.7, label="train (100-step windows)")
    if epochs:
        xs = [r["epoch"] + 1 for r in epochs]
        ax.plot(xs, [r["valid_ppl"] for r in epochs], "o-", label="valid")
        ax.plot(xs, [r["test_ppl"] for r in epochs], "s-", label="test")
    ax.axhline(114.5, color="gray", ls="--", lw=0.8, label="paper test 114.5")
    ax.set_yscale("log")
    ax.set_ylim(30, 1000)
    ax.set_xlabel("epoch")
    ax.set_ylabel("perplexity")
    ax.set_title(title or "PTB small (Zaremba et al. 2014), hotloop lstm_lm")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(png_path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    from hotloop.tools.hardware import machine_header
    print(machine_header("benchmarks/ptb_repro.py"), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hparams", default="lstm_lm_small")
    parser.add_argument("--hparams_overrides", default="")
    parser.add_argument("--strategy", default="intra_op_threads=2,inter_op_threads=1,sync_every=100")
    parser.add_argument("--out", required=True, help="output dir (log.jsonl, model.safetensors)")
    parser.add_argument("--data_dir", default=None, help="default: $HOTLOOP_DATA_DIR/ptb_lm")
    parser.add_argument("--raw_dir", default=None, help="default: $HOTLOOP_RAW_ROOT/ptb")
    parser.add_argument("--max_epochs", type=int, default=0, help="stop early (0 = hparams)")
    parser.add_argument("--max_steps_per_epoch", type=int, default=0)
    parser.add_argument("--plot", default="",
                        help="only plot OUT/metrics.jsonl (hotloop train) or OUT/log.jsonl to this PNG and exit")
    args = parser.parse_args(argv)
    if args.plot:
        out = Path(args.out)
        plot_log(out / "metrics.jsonl" if (out / "metrics.jsonl").exists() else out / "log.jsonl", args.plot)
        return

    declare_builtins()
    hp = get_hparams(args.hparams, args.hparams_overrides or None)
    strategy = Strategy.parse(args.strategy).validate("cpu")
    if strategy.intra_op_threads:
        torch.set_num_threads(strategy.intra_op_threads)
    if strategy.inter_op_threads:
        torch.set_num_interop_threads(strategy.inter_op_threads)
    torch.manual_seed(hp.seed)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = open(out_dir / "log.jsonl", "a", buffering=1)

    def emit(**record) -> None:
        record["time"] = time.time()
        log.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)

    problem = problems.get("ptb_lm")(data_dir=args.data_dir, raw_dir=args.raw_dir)
    problem.prepare()
    spec = problem.spec(hp)
    model = models.get("lstm_lm")(hp, spec)
    train_reader = problem.reader("train", hp)
    steps_per_epoch = len(train_reader)
    schedule = build_schedule(hp, steps_per_epoch)
    built = build_step(model, hp, strategy)
    step_fn, optimizer = built.step, built.optimizer
    emit(event="start", hparams=hp.to_dict(), strategy=strategy.to_dict(),
         threads=torch.get_num_threads(), steps_per_epoch=steps_per_epoch)

    epochs = args.max_epochs or hp.max_epochs
    global_step = 0
    t_start = time.time()
    for epoch in range(epochs):
        lr = hp.learning_rate * schedule.multiplier(global_step, epoch)
        for group in optimizer.param_groups:
            group["lr"] = lr
        state = model.initial_state(hp.batch_size, torch.device("cpu"))
        nll = torch.zeros(())
        tokens = torch.zeros((), dtype=torch.long)
        window_nll, window_tokens, t_window = 0.0, 0, time.time()
        model.train()
        for i, batch in enumerate(train_reader):
            if args.max_steps_per_epoch and i >= args.max_steps_per_epoch:
                break
            result = step_fn([batch], state)
            state = result.state
            nll += result.stats["nll_sum"]
            tokens += result.stats["tokens"]
            global_step += 1
            if global_step % strategy.sync_every == 0:
                total_nll, total_tokens = nll.item(), int(tokens)
                dt = time.time() - t_window
                emit(event="train", epoch=epoch, step=global_step, lr=lr,
                     ppl=math.exp((total_nll - window_nll) / max(total_tokens - window_tokens, 1)),
                     tokens_per_s=(total_tokens - window_tokens) / dt)
                window_nll, window_tokens, t_window = total_nll, total_tokens, time.time()
        train_ppl = math.exp(nll.item() / max(int(tokens), 1))
        valid_ppl = evaluate(model, problem.reader("valid", hp))
        test_ppl = evaluate(model, problem.reader("test", hp))
        schedule.on_eval(math.log(valid_ppl))
        emit(event="epoch", epoch=epoch, lr=lr, train_ppl=train_ppl, valid_ppl=valid_ppl,
             test_ppl=test_ppl, wall_s=time.time() - t_start)
    final_test = evaluate(model, problem.reader("test", hp, batch_size=1, num_steps=hp.max_length))
    emit(event="done", test_ppl_batch1=final_test, wall_s=time.time() - t_start)
    try:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out_dir / "model.safetensors"))
    except ImportError:
        pass


if __name__ == "__main__":
    main()
