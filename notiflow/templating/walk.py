"""Undeclared variables of a parsed template, by a plain walk of its syntax tree.

Mirrors Jinja's own scoping (``jinja2.idtracking`` and the frames its code generator opens)
without generating code, so no expression of the template is ever evaluated: a frame's own
statements are read in order (a name loaded before it is stored there comes from the
context), nested frames (``for`` bodies, macros, call and filter blocks, ``with``, block
assignments, blocks) see every name their parent frame stores, and a name stored in only some
branches of an ``if`` may come from the context.
"""

from __future__ import annotations

from collections.abc import Iterable

from jinja2 import nodes

_BRANCHES = 3
"""An ``if`` has three branches (body, elifs, else), present or not."""


class _Frame:
    __slots__ = ("parent", "refs", "stores")

    def __init__(self, parent: _Frame | None) -> None:
        self.parent = parent
        self.refs: set[str] = set()
        self.stores: set[str] = set()

    def knows(self, name: str) -> bool:
        frame: _Frame | None = self
        while frame is not None:
            if name in frame.refs:
                return True
            frame = frame.parent
        return False

    def declare(self, *names: str) -> None:
        self.refs.update(names)
        self.stores.update(names)


class _FrameWalk:
    """The statements of one frame in order; the frames nested in them once it is read."""

    def __init__(self, frame: _Frame, undeclared: set[str]) -> None:
        self.frame = frame
        self.undeclared = undeclared
        self.nested: list[nodes.Node] = []

    def load(self, name: str) -> None:
        if not self.frame.knows(name):
            self.undeclared.add(name)
            self.frame.refs.add(name)

    def visit(self, node: nodes.Node, param: bool = False) -> None:
        if isinstance(node, nodes.Name):
            if param or node.ctx in ("param", "store"):
                self.frame.declare(node.name)
            elif node.ctx == "load":
                self.load(node.name)
        elif isinstance(node, nodes.NSRef):
            self.load(node.name)
        elif isinstance(node, nodes.If):
            self._branches(node)
        elif isinstance(node, nodes.Macro):
            self.frame.declare(node.name)
            self.nested.append(node)
        elif isinstance(node, nodes.Import):
            self.visit(node.template)
            self.frame.declare(node.target)
        elif isinstance(node, nodes.FromImport):
            self.visit(node.template)
            self.frame.declare(*(n[1] if isinstance(n, tuple) else n for n in node.names))
        elif isinstance(node, nodes.Assign):
            self.visit(node.node)
            self.visit(node.target)
        elif isinstance(node, nodes.For):
            self.visit(node.iter)
            self.nested.append(node)
        elif isinstance(node, nodes.CallBlock):
            self.visit(node.call)
            self.nested.append(node)
        elif isinstance(node, nodes.FilterBlock):
            self.visit(node.filter)
            self.nested.append(node)
        elif isinstance(node, nodes.With):
            for value in node.values:
                self.visit(value)
            self.nested.append(node)
        elif isinstance(node, nodes.AssignBlock):
            self.visit(node.target)
            self.nested.append(node)
        elif isinstance(node, (nodes.Scope, nodes.OverlayScope, nodes.Block)):
            self.nested.append(node)
        else:
            for child in node.iter_child_nodes():
                self.visit(child)

    def visit_all(self, body: Iterable[nodes.Node], param: bool = False) -> None:
        for node in body:
            self.visit(node, param)

    def _branches(self, node: nodes.If) -> None:
        self.visit(node.test)
        frame = self.frame
        before = set(frame.stores)
        refs, stores = set(frame.refs), set(frame.stores)
        counts: dict[str, int] = {}
        for branch in (node.body, node.elif_, node.else_ or ()):
            frame.refs, frame.stores = set(refs), set(before)
            self.visit_all(branch)
            refs |= frame.refs
            stores |= frame.stores
            for name in frame.stores - before:
                counts[name] = counts.get(name, 0) + 1
        frame.refs, frame.stores = refs, stores
        for name, count in counts.items():
            if count < _BRANCHES and not (frame.parent and frame.parent.knows(name)):
                self.undeclared.add(name)


def _read_first(body: Iterable[nodes.Node], names: set[str]) -> set[str]:
    """Which of ``names`` ``body`` loads before storing (blocks aside): Jinja declares its
    special parameters (``loop``, ``caller``, ``self``...) only for those."""
    found: set[str] = set()
    todo = list(body)[::-1]
    while todo and names:
        node = todo.pop()
        if isinstance(node, nodes.Name) and node.name in names:
            names = names - {node.name}
            if node.ctx == "load":
                found.add(node.name)
        elif not isinstance(node, nodes.Block):
            todo.extend(list(node.iter_child_nodes())[::-1])
    return found


def _analyse_frame(frame: _Frame, fill: Iterable[tuple[Iterable[nodes.Node], bool]],
                   undeclared: set[str]) -> None:
    walk = _FrameWalk(frame, undeclared)
    for body, param in fill:
        walk.visit_all(body, param)
    for node in walk.nested:
        _nested(node, frame, undeclared)


def _nested(node: nodes.Node, parent: _Frame, undeclared: set[str]) -> None:
    inner = _Frame(parent)
    if isinstance(node, nodes.For):
        if node.recursive or any(b.scoped for b in node.find_all(nodes.Block)):
            inner.declare("loop")
        else:
            inner.declare(*_read_first(node.body, {"loop"}))
        _analyse_frame(inner, [([node.target], True), (node.body, False)], undeclared)
        if node.else_:
            _analyse_frame(_Frame(parent), [(node.else_, False)], undeclared)
        if node.test is not None:
            _analyse_frame(_Frame(inner), [([node.target], True), ([node.test], False)],
                           undeclared)
    elif isinstance(node, (nodes.Macro, nodes.CallBlock)):
        inner.declare(*_read_first(node.body, {"caller", "varargs", "kwargs"}))
        _analyse_frame(inner, [(node.args, True), (node.defaults, False),
                               (node.body, False)], undeclared)
    elif isinstance(node, nodes.FilterBlock):
        _analyse_frame(inner, [(node.body, False), ([node.filter], False)], undeclared)
    elif isinstance(node, nodes.With):
        _analyse_frame(inner, [(node.targets, False), (node.body, False)], undeclared)
    elif isinstance(node, nodes.AssignBlock):
        filters = [node.filter] if node.filter is not None else []
        _analyse_frame(inner, [(node.body, False), (filters, False)], undeclared)
    elif isinstance(node, nodes.Block):
        block = _Frame(None)
        block.declare(*_read_first(node.body, {"self", "super"}))
        _analyse_frame(block, [(node.body, False)], undeclared)
    elif isinstance(node, (nodes.Scope, nodes.OverlayScope)):
        _analyse_frame(inner, [(node.body, False)], undeclared)


def undeclared_variables(template: nodes.Template) -> set[str]:
    """Names the template reads from its context (Jinja's globals included)."""
    undeclared: set[str] = set()
    _analyse_frame(_Frame(None), [(template.body, False)], undeclared)
    return undeclared
