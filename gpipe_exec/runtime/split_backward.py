"""A backward pass split in two: the input's gradient now (I), the weights' gradients later (W).

`backward_input` computes only the gradient of the chunk's input and keeps the graph;
`backward_weight` then accumulates the parameters' gradients into `.grad` and lets the graph go.
Two ways to do W:

- "simple": one more `torch.autograd.grad` from the chunk's output to its parameters. Correct,
  but it walks the whole graph again, input path included.
- "reuse" (the default), after torch.distributed.pipelining's `stage_backward_input` /
  `stage_backward_weight`: during I, hooks keep the gradient that reaches each node where a
  parameter's branch joins the input path (the "meeting" nodes); W starts from those saved
  gradients and walks only the parameters' branches. Parameters whose branches share a meeting
  node are one group (one `autograd.grad` call); inside a group a meeting node reached again
  from another one is given its saved gradient, not a second one (no double counting).

A chunk whose input needs no gradient (the model's first) has nothing to do in I: its W is a
full backward, as torch's first stage does it.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Sequence

import torch
from torch.autograd.graph import GradientEdge, Node

WeightPass = Literal["reuse", "simple"]


def _node(t: torch.Tensor) -> Node | None:
    """The autograd node that produced `t`, or its gradient accumulator if `t` is a leaf."""
    if t.grad_fn is not None:
        return t.grad_fn
    if not t.requires_grad:
        return None
    view = t.view_as(t)  # accumulators are made lazily: a view reaches (and keeps) it
    assert view.grad_fn is not None
    return view.grad_fn.next_functions[0][0]


@dataclass(eq=False)  # compared by identity
class _Group:
    params: list[torch.nn.Parameter]
    accumulators: list[Node]
    meets: list[Node]
    grads: list[tuple[torch.Tensor | None, ...] | None] = field(default_factory=list)


@dataclass
class WeightWork:
    """What a deferred weight pass needs: the graph's end and its gradient (simple, or full when
    the input takes no gradient), or the parameter groups with their saved gradients (reuse)."""

    mode: str  # "simple", "full" or "reuse"
    output: torch.Tensor | None = None
    grad_output: torch.Tensor | None = None
    groups: list[_Group] = field(default_factory=list)


def _reverse_edges(root: Node) -> dict[Node, list[Node]]:
    """For every node under `root`, the nodes that consume its output."""
    reverse: dict[Node, list[Node]] = defaultdict(list)
    seen = {root}
    queue = deque([root])
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            reverse[child].append(node)
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return reverse


def _upward(starts: Iterable[Node], reverse: dict[Node, list[Node]], stop: set[Node]) -> tuple[set[Node], set[Node]]:
    """Nodes reached from `starts` towards the output, not going past nodes in `stop`:
    (the nodes passed, the `stop` nodes met)."""
    passed: set[Node] = set()
    met: set[Node] = set()
    queue = deque(n for n in starts if n is not None)
    passed.update(queue)
    while queue:
        node = queue.popleft()
        for parent in reverse.get(node, ()):
            if parent in stop:
                met.add(parent)
            elif parent not in passed:
                passed.add(parent)
                queue.append(parent)
    return passed, met


def _groups(reverse: dict[Node, list[Node]], input_node: Node, params: Sequence[torch.nn.Parameter]) -> list[_Group]:
    """Parameters grouped by the nodes where their branches meet the input's path."""
    on_input_path, _ = _upward([input_node], reverse, set())
    by_meet: dict[Node, _Group] = {}
    groups: list[_Group] = []
    for p in params:
        acc = _node(p)
        if acc is None or acc not in reverse:  # not used by this graph: no gradient
            continue
        _, meets = _upward([acc], reverse, on_input_path)
        joined = {id(by_meet[n]): by_meet[n] for n in meets if n in by_meet}
        group = _Group([p], [acc], sorted(meets, key=id))
        for other in joined.values():  # merge every group that shares a meeting node
            group.params += other.params
            group.accumulators += other.accumulators
            group.meets = list({**{id(n): n for n in other.meets}, **{id(n): n for n in group.meets}}.values())
            groups = [g for g in groups if g is not other]
        for n in group.meets:
            by_meet[n] = group
        groups.append(group)
    return groups


def backward_input(output: torch.Tensor, grad_output: torch.Tensor | None, input: torch.Tensor,
                   params: Sequence[torch.nn.Parameter], mode: WeightPass = "reuse"
                   ) -> tuple[torch.Tensor | None, WeightWork]:
    """The gradient of `input` (None if it takes none), and what the weight pass will need."""
    if not (isinstance(input, torch.Tensor) and input.requires_grad):
        return None, WeightWork("full", output, grad_output)
    if mode == "simple":
        (grad,) = torch.autograd.grad(output, [input], grad_output, retain_graph=True)
        return grad, WeightWork("simple", output, grad_output)
    root = _node(output)
    input_node = _node(input)
    assert root is not None and input_node is not None
    reverse = _reverse_edges(root)
    groups = _groups(reverse, input_node, params)
    if any(not group.meets for group in groups):  # a branch that never meets the input's path
        return backward_input(output, grad_output, input, params, "simple")
    handles = []
    try:
        for group in groups:
            group.grads = [None] * len(group.meets)
            for i, node in enumerate(group.meets):
                def keep(grads: tuple[Any, ...], group: _Group = group, i: int = i) -> None:
                    group.grads[i] = grads
                handles.append(node.register_prehook(keep))
        (grad,) = torch.autograd.grad(output, [input], grad_output, retain_graph=True)
    finally:
        for handle in handles:
            handle.remove()
    return grad, WeightWork("reuse", groups=groups)


Accumulated = Callable[[Sequence[torch.nn.Parameter]], None]


def _accumulate(params: Sequence[torch.nn.Parameter], grads: Sequence[torch.Tensor | None],
                accumulated: Accumulated | None = None) -> None:
    done = []
    for p, g in zip(params, grads):
        if g is None:
            continue
        if p.grad is None:
            p.grad = g
        else:
            p.grad += g
        done.append(p)
    if accumulated is not None:
        accumulated(done)


def backward_weight(work: WeightWork, params: Sequence[torch.nn.Parameter],
                    accumulated: Accumulated | None = None) -> None:
    """Accumulate the parameters' gradients into `.grad`; the graph is freed as it is walked.
    `accumulated(params)` is told each group of parameters whose gradients have just been added
    (as autograd's post-accumulate-grad hooks would be, which a gradient computed by
    `torch.autograd.grad` and added here does not fire; the "full" mode's backward fires them)."""
    if work.mode == "full":
        torch.autograd.backward(work.output, work.grad_output)
        return
    if work.mode == "simple":
        wanted = [p for p in params if p.requires_grad]
        grads = torch.autograd.grad(work.output, wanted, work.grad_output, allow_unused=True)
        _accumulate(wanted, grads, accumulated)
        return
    for group in work.groups:
        edges, seeds = [], []
        for node, saved in zip(group.meets, group.grads):
            for i, g in enumerate(saved or ()):
                if g is not None:
                    edges.append(GradientEdge(node, i))
                    seeds.append(g)
        if not edges:
            continue
        handles = []
        try:
            if len(group.meets) > 1:  # a meeting node reached from another gets its saved gradient
                for node, saved in zip(group.meets, group.grads):
                    handles.append(node.register_prehook(lambda _grads, saved=saved: saved))
            grads = torch.autograd.grad(edges, [GradientEdge(acc, 0) for acc in group.accumulators],
                                        grad_outputs=seeds, allow_unused=True)
        finally:
            for handle in handles:
                handle.remove()
        _accumulate(group.params, grads, accumulated)
    work.groups = []
