"""Speed ladder for the LSTM LM on PTB: plain PyTorch loop -> hotloop default, beside the expert loop.

Every rung trains its own copy of the same model (same seed, same weights) on
the same real PTB batches, in interleaved rounds inside this one process
(warm-up rounds discarded, medians of the rest), so load from other processes
hits every rung alike. Rungs are cumulative (each adds one change to the one
above); ``alt:`` rows are alternative formulations measured on top of the
previous cumulative rung but not carried forward. The ``expert`` row is the plain loop plus
what a competent PyTorch user writes (``benchmarks/expert_loop.py``): bf16 autocast only where
the CPU has fast bf16, foreach clip + SGD, ``zero_grad(set_to_none=True)``, the loss read once
per round; no hotloop formulation. The summary gives the default's ratio to it
(``default_vs_expert``) beside its ratio to the plain loop.

    PYTHONPATH=. python benchmarks/lstm_ladder.py --config small --steps 120 --json /tmp/ladder.json

Each timed round also times the step's GEMMs alone (``benchmarks/lstm_floor.py``, fp32
and bf16 operands), so the GEMM floor sees the same machine state as the rungs;
``floor_ratio`` is the default's median step over the floor's median.

After the timed rounds every rung's model is evaluated in fp32 (full logits)
on the same validation batches: ``ppl`` shows quality is unchanged.

hotloop's process-wide settings (:mod:`hotloop.engine.process_settings`: the oneDNN
primitive cache, host memory kept mapped) are applied first, as ``hotloop train`` does,
so every rung has them, the plain loop included: the ladder understates hotloop
against a plain loop in its own process (``benchmarks/host_memory.py`` measures the
host-memory setting alone).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from hotloop.builtin import declare_builtins
from hotloop.engine.clipping import clip_via_lr
from hotloop.engine.process_settings import apply_process_settings
from hotloop.engine.build import build_step
from hotloop.engine.strategy import Strategy
from hotloop.hparams import HParams, get_hparams
from hotloop.registry import models, problems

from lstm_parts import gemm_floor_ms, machine_facts, machine_line, summarize_floor
from lstm_rungs import EXPERT_PREFIX, LOSS_READ_EVERY, Rung, ladder_rungs, runnable_rungs

__all__ = ["CONFIGS", "RungRunner", "eval_ppl", "run_ladder", "machine_facts", "machine_line", "main"]

CONFIGS = {"small": "lstm_lm_small", "medium": "lstm_lm_medium", "large": "lstm_lm_large",
           "example": "lstm_lm_example"}


def _detach(state: Any) -> Any:
    return tuple(s.detach() for s in state)


class RungRunner:
    """Owns one rung's model, optimizer, carried state and batch iterator."""

    def __init__(self, rung: Rung, hp: HParams, problem: Any, default_threads: int) -> None:
        self.rung, self.problem = rung, problem
        self.hp = hp
        self.threads = (rung.strategy.intra_op_threads if rung.strategy else rung.threads) or default_threads
        torch.manual_seed(hp.seed)
        self.model = models.get("lstm_lm")(self.hp, problem.spec(self.hp))
        self.model.use_formulation(Strategy(**rung.formulation).formulation)
        self.model.train()
        self.params = list(self.model.parameters())
        fused = rung.strategy.fused_optimizer if rung.strategy else rung.foreach
        self.optimizer = torch.optim.SGD(self.params, lr=self.hp.learning_rate, foreach=fused)
        self.state = self.model.initial_state(self.hp.batch_size, torch.device("cpu"))
        self.nll = torch.zeros((), dtype=torch.float64)
        self.tokens = 0
        self.pending: list[torch.Tensor] = []
        reader = problem.reader("train", self.hp)
        use_prefetch = rung.prefetch or bool(rung.strategy and rung.strategy.prefetch)
        if use_prefetch:
            from hotloop.data import prefetch
            reader = prefetch(reader, capacity=2)
        self.batches: Iterator[dict[str, torch.Tensor]] = iter(reader)
        self.loss_fn: Callable[..., Any] = lambda m, b, s: m.loss(b, s)
        self.compile_seconds = 0.0
        if rung.compile:
            self.loss_fn = torch.compile(self.loss_fn, dynamic=False)
        self.rng = torch.get_rng_state()  # own dropout stream: every rung draws the same masks
        self.step_fn = None
        if rung.strategy is not None:
            built = build_step(self.model, self.hp, rung.strategy)
            self.step_fn, self.optimizer = built.step, built.optimizer

    # -- the user-style step (rungs 0-9) --------------------------------------
    def _plain_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(nll_sum, backprop loss) the way users write it."""
        vocab = self.model.output.out_features
        if self.rung.fused_kernel_ce:
            y, self.state = self.model.hidden_states(batch["inputs"], self.state)   # [T, B, H]
            logits = self.model.output(y)                                            # [T, B, V]
            nll = F.cross_entropy(logits.view(-1, vocab).float(), batch["targets"].t().reshape(-1),
                                  reduction="sum")
        else:
            logits, self.state = self.model(batch, self.state)                       # [B, T, V]
            log_probs = F.log_softmax(logits.reshape(-1, vocab).float(), dim=-1)
            nll = F.nll_loss(log_probs, batch["targets"].reshape(-1), reduction="sum")
        return nll, nll

    def step(self) -> None:
        rung, hp = self.rung, self.hp
        batch = next(self.batches)
        if self.step_fn is not None:
            result = self.step_fn([batch], self.state)
            self.state = result.state
            self.pending.append(result.stats["nll_sum"])
            self.tokens += batch["targets"].numel()
            return
        self.optimizer.zero_grad(set_to_none=rung.grads_to_none)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=rung.precision == "bf16"):
            if rung.model_loss:
                out = self.loss_fn(self.model, batch, self.state)
                self.state, nll, loss = out.state, out.stats["nll_sum"], out.loss
            else:
                nll, _ = self._plain_loss(batch)
                denom = batch["targets"].shape[0] if hp.loss_sum_over_time else batch["targets"].numel()
                loss = nll / denom
        loss.backward()
        if rung.clip_via_lr:
            clip_via_lr(self.optimizer, self.params, hp.max_grad_norm)
        else:
            torch.nn.utils.clip_grad_norm_(self.params, hp.max_grad_norm, foreach=rung.foreach)
            self.optimizer.step()
        self.state = _detach(self.state)
        self.tokens += batch["targets"].numel()
        if rung.sync_every_step:
            self.nll += nll.item()
        else:
            self.pending.append(nll.detach())
            if len(self.pending) >= LOSS_READ_EVERY:
                self.sync()

    def run(self, steps: int) -> float:
        torch.set_num_threads(self.threads)
        torch.set_rng_state(self.rng)
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        self.sync()
        elapsed = time.perf_counter() - start
        self.rng = torch.get_rng_state()
        return elapsed

    def sync(self) -> None:
        if self.pending:
            self.nll += torch.stack(self.pending).sum().double().item()
            self.pending.clear()


def _profile(runner: RungRunner, steps: int) -> str:
    """torch.profiler top ops (self CPU time) of ``steps`` steps of ``runner``."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.run(steps)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)


@torch.no_grad()
def eval_ppl(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> float:
    """fp32 perplexity with full logits over ``batches`` (state carried from zeros)."""
    was_training = model.training
    model.eval()
    state, nll, tokens = None, 0.0, 0
    for batch in batches:
        logits, state = model(batch, state)
        nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                               batch["targets"].reshape(-1), reduction="sum").item()
        tokens += batch["targets"].numel()
    model.train(was_training)
    return math.exp(nll / max(tokens, 1))


def hotloop_default_strategy(hp: HParams, problem: Any, mode: str, threads: int) -> tuple[Strategy, float, str]:
    """The strategy ``hotloop train`` would use: ``auto`` (tuned, timed) or a fixed one."""
    start = time.perf_counter()
    if mode == "auto":
        from hotloop.compose.plan import auto_strategy
        torch.manual_seed(hp.seed)
        model = models.get("lstm_lm")(hp, problem.spec(hp))
        strategy = auto_strategy(model, problem, hp, "cpu", log=lambda m: print("  [auto]", m))
        return strategy, time.perf_counter() - start, "auto"
    strategy = Strategy.parse(mode or None, Strategy(intra_op_threads=threads))
    return strategy, 0.0, "fixed"


def run_ladder(config: str, steps: int, rounds: int, warmup_rounds: int, threads: int,
               eval_batches: int, strategy_mode: str, with_compile: bool, only: str = "",
               extra_strategy: str = "", profile_steps: int = 0,
               data_dir: str | None = None, raw_dir: str | None = None) -> dict[str, Any]:
    declare_builtins()
    apply_process_settings()        # as hotloop train does: every rung, the plain loop included
    hp = get_hparams(CONFIGS[config])
    problem = problems.get("ptb_lm")(data_dir=data_dir, raw_dir=raw_dir)
    problem.prepare()
    default_threads = torch.get_num_threads()
    strategy, tune_s, how = hotloop_default_strategy(hp, problem, strategy_mode, threads)
    print(f"hotloop default strategy ({how}, {tune_s:.1f}s): {strategy}")
    extra = Strategy.parse(extra_strategy) if extra_strategy else None
    print(machine_line("lstm_ladder.py"))
    rungs = runnable_rungs(ladder_rungs(threads, strategy, with_compile, extra))
    if only:
        keep = [s.strip() for s in only.split(",")]
        rungs = [r for r in rungs
                 if r.name.split(" ")[0] in keep or r.name.startswith(("0 ", EXPERT_PREFIX, "hotloop"))]
    runners = [RungRunner(r, hp, problem, default_threads) for r in rungs]
    per_round = max(1, steps // rounds)
    times: list[list[float]] = [[] for _ in runners]
    floors: list[dict[str, float]] = []
    for rnd in range(warmup_rounds + rounds):
        order = runners if rnd % 2 == 0 else list(reversed(runners))  # alternate order
        for runner in order:
            t0 = time.perf_counter()
            if rnd == 0 and runner.rung.compile:
                runner.run(1)
                runner.compile_seconds = time.perf_counter() - t0
                runner.run(per_round - 1)
            else:
                runner.run(per_round)
            if rnd >= warmup_rounds:
                times[runners.index(runner)].append((time.perf_counter() - t0) / per_round)
        if rnd >= warmup_rounds:   # the floor is a contender too: timed in every round, beside the rungs
            floors.append(gemm_floor_ms(config, threads))
        print(f"round {rnd + 1}/{warmup_rounds + rounds} done", flush=True)
    profile_table = _profile(runners[-1], profile_steps) if profile_steps else ""
    torch.set_num_threads(threads)  # evaluation is not timed: use the ladder's thread count
    valid = []
    for i, batch in enumerate(problem.reader("valid", hp)):
        if i >= eval_batches:
            break
        valid.append(batch)
    tokens_per_step = hp.batch_size * hp.max_length
    rows = []
    for runner, ts in zip(runners, times):
        sec = statistics.median(ts)
        rows.append({"name": runner.rung.name, "tokens_per_s": tokens_per_step / sec,
                     "ms_per_step": 1000 * sec, "threads": runner.threads,
                     "ppl": eval_ppl(runner.model, valid),
                     "train_ppl": math.exp(runner.nll.item() / max(runner.tokens, 1)),
                     "cumulative": runner.rung.cumulative,
                     **({"compile_s": runner.compile_seconds} if runner.rung.compile else {})})
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / base
    floor = summarize_floor(floors, threads)
    default_ms = rows[-1]["ms_per_step"] if rows[-1]["name"].startswith("hotloop") else None
    expert_ms = next((r["ms_per_step"] for r in rows if r["name"].startswith(EXPERT_PREFIX)), None)
    return {"config": config, "hparams_set": CONFIGS[config], "steps_per_rung": per_round * (warmup_rounds + rounds),
            "timed_steps_per_rung": per_round * rounds, "rounds": rounds, "warmup_rounds": warmup_rounds,
            "default_threads": default_threads, "ladder_threads": threads,
            "strategy": strategy.to_dict(), "strategy_source": how, "strategy_tune_s": tune_s,
            "profile_last_rung": profile_table, "rows": rows, "best_speedup": max(r["speedup"] for r in rows),
            "default_speedup": rows[-1]["speedup"] if default_ms is not None else None,
            "default_vs_expert": expert_ms / default_ms if default_ms is not None and expert_ms else None,
            **machine_facts(), "process_settings": apply_process_settings(), "gemm_floor_ms": floor["floor_ms"], "gemm_floor": floor,
            "floor_ratio": default_ms / floor["floor_ms"] if default_ms is not None else None}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--steps", type=int, default=120, help="timed steps per rung")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup_rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="intra-op threads for rungs >= 1 (default: torch's default)")
    parser.add_argument("--eval_batches", type=int, default=40)
    parser.add_argument("--strategy", default="auto",
                        help="'auto' (what hotloop train does) or Strategy overrides k=v,...")
    parser.add_argument("--compile", action="store_true", help="add a torch.compile rung")
    parser.add_argument("--extra_strategy", default="",
                        help="also time build_step with Strategy() + these overrides (e.g. intra_op_threads=1)")
    parser.add_argument("--only", default="",
                        help="comma list of rung ids to keep, e.g. 1,2,8,9 (0, expert and hotloop rows always kept)")
    parser.add_argument("--profile_steps", type=int, default=0,
                        help="profile this many steps of the last rung (torch.profiler top ops)")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    result = run_ladder(args.config, args.steps, args.rounds, args.warmup_rounds, args.threads,
                        args.eval_batches, args.strategy, args.compile, args.only, args.extra_strategy,
                        args.profile_steps)
    print(f"\n{'; '.join(result['process_settings'])} (process-wide: every rung, the plain loop included)")
    print(f"config {result['config']}: {result['timed_steps_per_rung']} timed steps/rung, "
          f"default threads {result['default_threads']}; {result['cpu']}, AMX {'present' if result['amx'] else 'absent'}")
    print(f"{'rung':58s} {'tok/s':>8s} {'ms/step':>8s} {'speedup':>8s} {'ppl':>8s}")
    for row in result["rows"]:
        print(f"{row['name']:58s} {row['tokens_per_s']:8.0f} {row['ms_per_step']:8.1f} "
              f"{row['speedup']:7.2f}x {row['ppl']:8.2f}")
    if result["floor_ratio"] is not None:
        print(f"GEMM floor {result['gemm_floor_ms']:.1f} ms/step ({result['gemm_floor']['dtype']} operands); "
              f"hotloop default {result['floor_ratio']:.2f}x the floor, {result['default_speedup']:.2f}x the plain loop")
    if result["default_vs_expert"] is not None:
        print(f"hotloop default {result['default_speedup']:.2f}x the plain loop, "
              f"{result['default_vs_expert']:.2f}x the expert loop (same batches, interleaved rounds)")
    if result["profile_last_rung"]:
        print("\nprofile of the last rung:\n" + result["profile_last_rung"])
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
