"""Executors for captured FX graphs (Paddle's serial executor and ParallelExecutor).

Both take an ``fx.GraphModule`` whose graph holds ``placeholder`` inputs,
``get_attr`` constants, ``call_function`` ops and one ``output``:

- :class:`SerialExecutor` runs the nodes in topological order, freeing every
  value after its last use.
- :class:`ParallelExecutor` counts each node's unfinished inputs and runs ready
  nodes on a pool of ``num_threads`` threads (torch ops release the GIL).
  Cheap alias nodes (``getitem``, views) run inline on the thread that made
  their input, and a finishing thread keeps one ready successor for itself.

Ordering edges keep results bitwise equal to the serial order: random ops
(``nondeterministic_seeded``) run in graph order, and an op that writes its
argument waits for every earlier reader of that argument.
Both run with autograd off (the graph already holds the backward).
"""
from __future__ import annotations

import operator
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import fx

from .thread_pool import shared_pool

__all__ = ["ExecutorError", "SerialExecutor", "ParallelExecutor", "make_executor", "is_random_op",
           "mutated_args"]


class ExecutorError(RuntimeError):
    """A graph node failed while executing; names the node."""


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def is_random_op(node: fx.Node) -> bool:
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def mutated_args(node: fx.Node) -> list[fx.Node]:
    """Input nodes this op writes to (from the op schema's alias annotations)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    out = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            if isinstance(value, fx.Node):
                out.append(value)
    return out


_CHEAP = {operator.getitem, torch.ops.aten.view.default, torch.ops.aten.t.default,
          torch.ops.aten.transpose.int, torch.ops.aten.permute.default, torch.ops.aten.expand.default,
          torch.ops.aten.unsqueeze.default, torch.ops.aten.squeeze.dim, torch.ops.aten.select.int,
          torch.ops.aten.slice.Tensor, torch.ops.aten._unsafe_view.default, torch.ops.aten.alias.default,
          torch.ops.aten.detach.default, torch.ops.aten.unbind.int}


@dataclass
class _NodeCall:
    index: int               # env slot of this node's value
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    name: str


class _Plan:
    """The graph lowered to slots: inputs, constants, steps, outputs, last uses, dependencies."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        nodes = list(gm.graph.nodes)
        self.slot = {n: i for i, n in enumerate(nodes)}
        self.size = len(nodes)
        self.inputs = [self.slot[n] for n in nodes if n.op == "placeholder"]
        self.constants = [(self.slot[n], _fetch_attr(gm, n.target)) for n in nodes if n.op == "get_attr"]
        self.steps: list[_NodeCall] = []
        self.output: Any = None
        for n in nodes:
            if n.op == "call_function":
                args = fx.node.map_arg(n.args, lambda a: _Slot(self.slot[a]))
                kwargs = fx.node.map_arg(n.kwargs, lambda a: _Slot(self.slot[a]))
                self.steps.append(_NodeCall(self.slot[n], n.target, args, kwargs, n.name))
            elif n.op == "output":
                self.output = fx.node.map_arg(n.args[0], lambda a: _Slot(self.slot[a]))
            elif n.op not in ("placeholder", "get_attr"):
                raise ExecutorError(f"graph node {n.name}: op {n.op!r} is not supported by hotloop executors")
        self.nodes = nodes
        keep = {s.index for s in _flatten(self.output)}
        # outputs that are graph inputs or constants are copied, so callers never alias them
        self.copy_out = {s.index for s in _flatten(self.output) if nodes[s.index].op in ("placeholder", "get_attr")}
        last_use: dict[int, int] = {}
        for pos, n in enumerate(nodes):
            for a in n.all_input_nodes:
                last_use[self.slot[a]] = pos
        self.free_after: dict[int, list[int]] = {}
        for slot_index, pos in last_use.items():
            if slot_index not in keep:
                self.free_after.setdefault(pos, []).append(slot_index)
        self.deps = self._dependencies()

    def _dependencies(self) -> dict[int, set[int]]:
        """Slot -> slots of compute nodes it must wait for (data + ordering edges)."""
        computed = {self.slot[n] for n in self.nodes if n.op == "call_function"}
        deps = {self.slot[n]: {self.slot[a] for a in n.all_input_nodes if self.slot[a] in computed}
                for n in self.nodes if n.op == "call_function"}
        last_random: int | None = None
        for n in self.nodes:
            if n.op != "call_function":
                continue
            me = self.slot[n]
            if is_random_op(n):
                if last_random is not None:
                    deps[me].add(last_random)
                last_random = me
            for target in mutated_args(n):
                for reader in target.users:
                    r = self.slot[reader]
                    if r < me and r in computed:
                        deps[me].add(r)
        return deps

    def start_env(self, inputs: list[Any]) -> list[Any]:
        if len(inputs) != len(self.inputs):
            raise ExecutorError(f"graph takes {len(self.inputs)} inputs, got {len(inputs)}")
        env: list[Any] = [None] * self.size
        for slot_index, value in zip(self.inputs, inputs):
            env[slot_index] = value
        for slot_index, value in self.constants:
            env[slot_index] = value
        return env

    def finish(self, env: list[Any]) -> list[Any]:
        return [env[s.index].clone() if s.index in self.copy_out else env[s.index]
                for s in _flatten(self.output)]


def _flatten(obj: Any) -> list[_Slot]:
    if isinstance(obj, _Slot):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [s for o in obj for s in _flatten(o)]
    return []


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


class _Codegen:
    """Lower steps to Python source: one line per node, constants and ops bound as globals."""

    def __init__(self, plan: _Plan, slot_name: Callable[[int], str]) -> None:
        self.plan = plan
        self.slot_name = slot_name
        self.globals: dict[str, Any] = {}

    def const(self, value: Any) -> str:
        name = f"k{len(self.globals)}"
        self.globals[name] = value
        return name

    def render(self, obj: Any) -> str:
        if isinstance(obj, _Slot):
            return self.slot_name(obj.index)
        if isinstance(obj, list):
            return "[" + ", ".join(self.render(o) for o in obj) + "]"
        if isinstance(obj, tuple):
            return "(" + "".join(self.render(o) + ", " for o in obj) + ")"
        if obj is None or isinstance(obj, (bool, int)):
            return repr(obj)
        return self.const(obj)

    def call(self, step: _NodeCall) -> str:
        fn = self.const(step.fn)
        parts = [self.render(a) for a in step.args]
        parts += [f"{k}={self.render(v)}" for k, v in step.kwargs.items()]
        return f"{fn}({', '.join(parts)})"

    def compile(self, source: str, filename: str) -> dict[str, Any]:
        namespace = dict(self.globals)
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - source built from the graph
        return namespace


class SerialExecutor:
    """Run the graph's nodes one after another in topological order.

    The graph is lowered once to a straight-line Python function (one line per
    op, a value dropped right after its last use), so running it costs one
    Python call per op and nothing else.
    """

    kind = "serial"
    _count = 0

    def __init__(self, gm: fx.GraphModule) -> None:
        self.plan = _Plan(gm)
        SerialExecutor._count += 1
        self.filename = f"<hotloop-serial-{SerialExecutor._count}>"
        gen = _Codegen(self.plan, lambda i: f"v{i}")
        pos_of = {self.plan.slot[n]: pos for pos, n in enumerate(self.plan.nodes)}
        lines = ["def run(env):"]
        for i in self.plan.inputs + [c[0] for c in self.plan.constants]:
            lines.append(f"    v{i} = env[{i}]")
        self.line_to_step: dict[int, _NodeCall] = {}
        for step in self.plan.steps:
            self.line_to_step[len(lines) + 1] = step
            lines.append(f"    v{step.index} = {gen.call(step)}")
            dead = self.plan.free_after.get(pos_of[step.index], ())
            if dead:
                lines.append("    " + "; ".join(f"v{d} = None" for d in dead))
        outs = _flatten(self.plan.output)
        lines.append("    return [" + "".join(f"v{o.index}, " for o in outs) + "]")
        self.source = "\n".join(lines) + "\n"
        self._run = gen.compile(self.source, self.filename)["run"]

    def run(self, inputs: list[Any]) -> list[Any]:
        env = self.plan.start_env(inputs)
        try:
            with torch.no_grad():
                values = self._run(env)
        except Exception as exc:
            step = self._failed_step(exc)
            if step is None:
                raise
            raise ExecutorError(f"graph node {step.name} ({step.fn}) failed: {exc}") from exc
        outs = _flatten(self.plan.output)
        return [v.clone() if o.index in self.plan.copy_out else v for o, v in zip(outs, values)]

    def _failed_step(self, exc: BaseException) -> _NodeCall | None:
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == self.filename:
                return self.line_to_step.get(tb.tb_lineno)
            tb = tb.tb_next
        return None


class _Run:
    """One execution of the plan: values, pending input counts, completion."""

    def __init__(self, env: list[Any], pending: dict[int, int], total: int, left: dict[int, int]) -> None:
        self.env = env
        self.pending = pending
        self.left = left              # unfinished readers per value; 0 -> the value is dropped
        self.remaining = total
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error: BaseException | None = None


class ParallelExecutor:
    """Dependency-counting scheduler over a pool of ``num_threads`` worker threads."""

    kind = "parallel"

    def __init__(self, gm: fx.GraphModule, num_threads: int = 2) -> None:
        if num_threads < 1:
            raise ExecutorError("parallel executor needs num_threads >= 1")
        self.plan = _Plan(gm)
        self.num_threads = num_threads
        self.step_of = {s.index: s for s in self.plan.steps}
        self.users: dict[int, list[int]] = {s.index: [] for s in self.plan.steps}
        for me, deps in self.plan.deps.items():
            for d in deps:
                self.users[d].append(me)
        self.cheap = {s.index for s in self.plan.steps if s.fn in _CHEAP}
        keep = {s.index for s in _flatten(self.plan.output)}
        self.reads: dict[int, list[int]] = {}
        self.readers: dict[int, int] = {}
        for n in self.plan.nodes:
            if n.op == "call_function":
                me = self.plan.slot[n]
                self.reads[me] = [self.plan.slot[a] for a in n.all_input_nodes
                                  if a.op == "call_function" and self.plan.slot[a] not in keep]
                for a in self.reads[me]:
                    self.readers[a] = self.readers.get(a, 0) + 1
        gen = _Codegen(self.plan, lambda i: f"env[{i}]")
        source = "".join(f"def s{s.index}(env):\n    env[{s.index}] = {gen.call(s)}\n" for s in self.plan.steps)
        namespace = gen.compile(source, "<hotloop-parallel>")
        self.compiled = {s.index: namespace[f"s{s.index}"] for s in self.plan.steps}
        self.roots = [s.index for s in self.plan.steps if not self.plan.deps[s.index]]
        self.pool = shared_pool(num_threads)
        self.run_lock = threading.Lock()

    def work(self, run: "_Run", index: int | None) -> None:
        """Worker entry: run ``index`` and continue with one ready successor at a time."""
        while index is not None and run.error is None:
            try:
                index = self._execute(run, index)
            except BaseException as exc:  # noqa: BLE001 - reported to the caller
                run.error = exc
                run.done.set()
                index = None

    def _call(self, index: int, env: list[Any]) -> None:
        try:
            self.compiled[index](env)
        except Exception as exc:
            step = self.step_of[index]
            raise ExecutorError(f"graph node {step.name} ({step.fn}) failed: {exc}") from exc

    def _execute(self, run: _Run, index: int) -> int | None:
        """Run one node (and cheap successors inline); return a ready node to continue with."""
        self._call(index, run.env)
        ready: list[int] = []
        finished = 1
        stack = [index]
        while stack:
            me = stack.pop()
            newly: list[int] = []
            with run.lock:
                for u in self.users[me]:
                    run.pending[u] -= 1
                    if run.pending[u] == 0:
                        newly.append(u)
                for a in self.reads[me]:
                    run.left[a] -= 1
                    if run.left[a] == 0:
                        run.env[a] = None
            for u in newly:
                if u in self.cheap:
                    self._call(u, run.env)
                    finished += 1
                    stack.append(u)
                else:
                    ready.append(u)
        with run.lock:
            run.remaining -= finished
            if run.remaining == 0:
                run.done.set()
        if not ready:
            return None
        for u in ready[1:]:
            self.pool.put((self, run, u))
        return ready[0]

    def run(self, inputs: list[Any]) -> list[Any]:
        with self.run_lock:
            env = self.plan.start_env(inputs)
            pending = {i: len(d) for i, d in self.plan.deps.items()}
            run = _Run(env, pending, len(self.plan.steps), dict(self.readers))
            if not self.plan.steps:
                return self.plan.finish(env)
            for r in self.roots:
                self.pool.put((self, run, r))
            run.done.wait()
            if run.error is not None:
                raise run.error
            return self.plan.finish(env)


def make_executor(gm: fx.GraphModule, kind: str = "serial", num_threads: int = 2) -> SerialExecutor | ParallelExecutor:
    """``kind``: "serial" or "parallel" (``num_threads`` workers)."""
    if kind == "serial":
        return SerialExecutor(gm)
    if kind == "parallel":
        return ParallelExecutor(gm, num_threads)
    raise ExecutorError(f"unknown executor {kind!r}; choose serial or parallel")
