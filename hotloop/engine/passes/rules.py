"""A small rewrite-rule framework over FX graphs: patterns and replacements as data.

A pattern is a tree of :class:`Op` (a call to one of ``targets`` whose
arguments match sub-patterns), :class:`Var` (binds any argument, optionally
checked by a predicate) and plain constants (must be equal). A replacement is
either a :class:`Var` (reuse a bound value) or an :class:`Op` template built
from the bindings. ``where(bindings)`` adds conditions that need the values'
metadata (shapes, strides, users); inner pattern nodes need no other users
unless the rule says ``shared_inner=True``.

    RewriteRule("view_of_view",
                pattern=Op(aten.view, Op(aten.view, Var("x"), Var()), Var("shape")),
                replacement=Op(aten.view, Var("x"), Var("shape")),
                where=lambda b: is_contiguous(b["x"]))
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from torch import fx

__all__ = ["Op", "Var", "RewriteRule", "PassResult", "apply_rules", "meta", "users_count"]


@dataclass(frozen=True)
class Var:
    """Binds the argument at this position to ``name`` (``None``: match anything, bind nothing)."""

    name: str | None = None
    check: Callable[[Any], bool] | None = None


@dataclass(frozen=True)
class Op:
    """A call of one of ``targets`` whose positional arguments match ``args``.

    Fewer patterns than arguments (or any keyword argument) match only when
    ``allow_extra=True``; otherwise the call must have exactly these arguments. ``bind`` names the matched node itself.
    """

    targets: Any
    args: tuple = ()
    bind: str | None = None
    allow_extra: bool = False

    def __init__(self, targets: Any, *args: Any, bind: str | None = None, allow_extra: bool = False) -> None:
        object.__setattr__(self, "targets", tuple(targets) if isinstance(targets, (tuple, list, set)) else (targets,))
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "bind", bind)
        object.__setattr__(self, "allow_extra", allow_extra)


@dataclass(frozen=True)
class RewriteRule:
    """``pattern`` -> ``replacement`` (or ``build(graph, bindings, root) -> node``) under ``where``."""

    name: str
    pattern: Op
    replacement: Op | Var | None = None
    where: Callable[[dict[str, Any]], bool] | None = None
    build: Callable[[fx.Graph, dict[str, Any], fx.Node], Any] | None = None
    shared_inner: bool = False
    doc: str = ""


@dataclass
class PassResult:
    """What one pass did: matches per rule, nodes before/after, notes."""

    name: str
    matches: dict[str, int] = field(default_factory=dict)
    nodes_before: int = 0
    nodes_after: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.matches.values())

    def line(self) -> str:
        detail = ", ".join(f"{k}={v}" for k, v in self.matches.items()) or "no rules"
        return f"{self.name}: {self.total} match(es) [{detail}] nodes {self.nodes_before} -> {self.nodes_after}"


def meta(value: Any) -> Any:
    """The example value (a FakeTensor) recorded for a node at capture, or the constant itself."""
    return value.meta.get("val") if isinstance(value, fx.Node) else value


def users_count(node: fx.Node) -> int:
    return len(node.users)


def _match(pattern: Any, value: Any, bindings: dict[str, Any], inner: list[fx.Node]) -> bool:
    if isinstance(pattern, Var):
        if pattern.check is not None and not pattern.check(value):
            return False
        if pattern.name is not None:
            if pattern.name in bindings and bindings[pattern.name] is not value:
                return False
            bindings[pattern.name] = value
        return True
    if isinstance(pattern, Op):
        if not (isinstance(value, fx.Node) and value.op == "call_function" and value.target in pattern.targets):
            return False
        if value.kwargs and not pattern.allow_extra:
            return False
        if len(value.args) < len(pattern.args):
            return False
        if len(value.args) > len(pattern.args) and not pattern.allow_extra:
            return False
        if pattern.bind:
            bindings[pattern.bind] = value
        inner.append(value)
        return all(_match(p, a, bindings, inner) for p, a in zip(pattern.args, value.args))
    return pattern == value


def _build(template: Any, graph: fx.Graph, bindings: dict[str, Any]) -> Any:
    if isinstance(template, Var):
        return bindings[template.name]
    if isinstance(template, Op):
        args = tuple(_build(a, graph, bindings) for a in template.args)
        return graph.call_function(template.targets[0], args)
    if isinstance(template, (list, tuple)):
        return type(template)(_build(t, graph, bindings) for t in template)
    return template


def apply_rules(gm: fx.GraphModule, rules: Iterable[RewriteRule], name: str) -> PassResult:
    """Apply ``rules`` until none matches (one sweep per round, at most 8 rounds)."""
    graph = gm.graph
    result = PassResult(name, {r.name: 0 for r in rules}, nodes_before=len(graph.nodes))
    rules = list(rules)
    for _ in range(8):
        changed = False
        for node in list(graph.nodes):
            if getattr(node, "_erased", False) or node.op != "call_function":
                continue
            for rule in rules:
                bindings: dict[str, Any] = {}
                inner: list[fx.Node] = []
                if not _match(rule.pattern, node, bindings, inner):
                    continue
                if not rule.shared_inner and any(len(n.users) != 1 for n in inner[1:]):
                    continue
                if rule.where is not None and not rule.where(bindings):
                    continue
                with graph.inserting_before(node):
                    if rule.build is not None:
                        new = rule.build(graph, bindings, node)
                    else:
                        new = _build(rule.replacement, graph, bindings)
                if isinstance(new, fx.Node) and new is not node:
                    if "val" in node.meta and "val" not in new.meta:
                        new.meta["val"] = node.meta["val"]
                    node.replace_all_uses_with(new)
                    graph.erase_node(node)
                    for n in inner[1:]:
                        if not getattr(n, "_erased", False) and not n.users:
                            graph.erase_node(n)
                result.matches[rule.name] += 1
                changed = True
                break
        if not changed:
            break
    graph.lint()
    gm.recompile()
    result.nodes_after = len(graph.nodes)
    return result
