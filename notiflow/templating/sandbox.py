"""A sandbox whose every costly step is charged to the render's budget.

:class:`BudgetedEnvironment` compiles without evaluating any expression at compile time (no
constant folding) and, while a :class:`Budget` is active (:func:`active`), refuses before
allocating: sequences and strings over ``max_output`` built by ``*``, ``+``, ``%``, ``~``,
filters and ``str`` methods; integers over ``max_int_bits``; a ``range`` over
``max_range``; loop iterations over ``max_iterations``; calls nested deeper than
``max_depth``; CPU time over ``cpu_time`` (checked at every iteration, call, operator and
filter). A refusal is a :class:`BudgetExceeded`, never an allocation that may fail later.
"""

from __future__ import annotations

import contextlib
import functools
import re
import types
from collections.abc import Callable, Iterable, Iterator, KeysView, Mapping, ValuesView
from contextvars import ContextVar
from typing import Any

from jinja2 import StrictUndefined, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.utils import _PassArg
from jinja2.visitor import NodeTransformer

from notiflow.settings import RenderLimits

OUTPUT_LEVELS = 4
"""Everything expressions output, at every macro level together, may total this many times
``max_output`` (a macro's output counts again where it is output)."""

_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?.")
_DIGITS = re.compile(r"\d+")
_GROWTH: dict[str, int] = {"escape": 6, "e": 6, "forceescape": 6, "urlencode": 9,
                           "urlize": 4, "tojson": 6, "pprint": 6, "xmlattr": 6}
"""Filters whose output may be larger than their input: at most this many times."""


class BudgetExceeded(Exception):
    """A template asked for more than its budget; ``spent`` when time or iterations ran
    out (the template is costly whatever its size checks)."""

    def __init__(self, message: str, spent: bool = False, cpu: bool = False) -> None:
        super().__init__(message)
        self.spent = spent
        self.cpu = cpu
        """The CPU deadline passed (a garbage collection or a preemption can cause that
        once; loop iterations and sizes are deterministic)."""


class Budget:
    """What one render may still spend; ``clock`` is the thread's CPU time in seconds."""

    def __init__(self, limits: RenderLimits, clock: Callable[[], float]) -> None:
        self.limits = limits
        self.clock = clock
        self.deadline = clock() + limits.cpu_time.total_seconds()
        self.iterations = 0
        self.depth = 0
        self.produced = 0

    def check(self) -> None:
        if self.clock() > self.deadline:
            raise BudgetExceeded(f"render took more than {self.limits.cpu_time} of CPU",
                                 spent=True, cpu=True)

    def tick(self) -> None:
        self.iterations += 1
        if self.iterations > self.limits.max_iterations:
            raise BudgetExceeded(f"more than {self.limits.max_iterations} loop iterations",
                                 spent=True)
        self.check()

    def fits(self, size: int, what: str) -> None:
        if size > self.limits.max_output:
            raise BudgetExceeded(f"{what} would exceed {self.limits.max_output} items")

    def bits(self, bits: int, what: str) -> None:
        if bits > self.limits.max_int_bits:
            raise BudgetExceeded(f"{what} would exceed {self.limits.max_int_bits}-bit integers")

    def result(self, value: Any, what: str) -> Any:
        """``value`` if within the size caps (an oversized one was already built: refused)."""
        if isinstance(value, (str, bytes, list, tuple, dict)):
            self.fits(len(value), what)
        elif isinstance(value, int):
            self.bits(value.bit_length(), what)
        return value

    def weight(self, value: Any) -> int:
        """Upper estimate of ``str(value)``'s length, stopping once over ``max_output``."""
        limit = self.limits.max_output
        total, stack = 0, [value]
        while stack and total <= limit:
            v = stack.pop()
            if isinstance(v, (str, bytes)):
                total += len(v)
            elif isinstance(v, bool) or v is None:
                total += 5
            elif isinstance(v, int):
                total += v.bit_length() // 3 + 2
            elif isinstance(v, float):
                total += 24
            elif isinstance(v, Mapping):
                total += 2 + 4 * len(v)
                stack.extend(list(v.keys())[:limit])
                stack.extend(list(v.values())[:limit])
            elif isinstance(v, (list, tuple, set, frozenset, KeysView, ValuesView)):
                total += 2 + 2 * len(v)
                stack.extend(list(v)[:limit])
            else:
                total += 64
        return total

    def take(self, items: Iterable[Any]) -> list[Any]:
        """An iterator's items as a list, refused past ``max_output`` items."""
        out: list[Any] = []
        for item in items:
            out.append(item)
            if len(out) > self.limits.max_output:
                raise BudgetExceeded(f"more than {self.limits.max_output} items")
        self.check()
        return out


_current: ContextVar[Budget | None] = ContextVar("notiflow_render_budget", default=None)


def current() -> Budget:
    """The active budget; outside a render (e.g. compile-time folding) nothing may run."""
    budget = _current.get()
    if budget is None:
        raise BudgetExceeded("evaluation outside a budgeted render")
    return budget


@contextlib.contextmanager
def active(budget: Budget) -> Iterator[Budget]:
    """Make ``budget`` the one charged by the sandbox in this thread/context."""
    token = _current.set(budget)
    try:
        yield budget
    finally:
        _current.reset(token)


def budgeted(iterable: Iterable[Any]) -> Iterator[Any]:
    """``iterable`` charging one iteration per item (every ``for`` loop iterates this)."""
    budget = current()
    for item in iterable:
        budget.tick()
        yield item


def joined(*parts: Any) -> str:
    """The ``~`` operator, refused past ``max_output`` characters."""
    budget = current()
    budget.fits(sum(budget.weight(p) for p in parts), "~")
    return "".join(map(str, parts))


def _range(*args: int) -> range:
    budget = current()
    r = range(*args)
    try:
        n = len(r)
    except OverflowError:
        n = budget.limits.max_range + 1
    if n > budget.limits.max_range:
        raise BudgetExceeded(f"range() of more than {budget.limits.max_range} items")
    return r


def _finalize(value: Any) -> Any:
    budget = current()
    budget.check()
    size = len(value) if type(value) is str else budget.weight(value)
    budget.fits(size, "output")
    budget.produced += size
    if budget.produced > OUTPUT_LEVELS * budget.limits.max_output:
        raise BudgetExceeded(f"output over {OUTPUT_LEVELS} x {budget.limits.max_output} "
                             "characters at all levels")
    return value


def _number(text: str | None, args: Any) -> int:
    if not text:
        return 0
    if text == "*":
        values = args if isinstance(args, tuple) else (args,)
        return max((abs(v) for v in values if isinstance(v, int)), default=0)
    return int(text) if len(text) <= 9 else 1 << 62


def percent_size(budget: Budget, fmt: str, args: Any) -> int:
    """Upper estimate of ``fmt % args``: the format, the arguments, every width and
    precision."""
    size = len(fmt) + budget.weight(args)
    for spec in _PERCENT.finditer(fmt):
        size += _number(spec.group(1), args) + _number(spec.group(2), args)
    return size


def _replace_size(s: str, old: str, new: str, count: int = -1) -> int:
    n = len(s) + 1 if old == "" else s.count(old)
    if count is not None and count >= 0:
        n = min(n, count)
    return len(s) + n * max(0, len(new) - len(old))


def _as_int(value: Any, default: int) -> int:
    return value if isinstance(value, int) else default


def _str_method_size(budget: Budget, s: str | bytes, name: str, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> int:
    arg = args[0] if args else next(iter(kwargs.values()), None)
    if name in ("center", "ljust", "rjust", "zfill"):
        return max(len(s), _as_int(arg, 0))
    if name == "expandtabs":
        tab = "\t" if isinstance(s, str) else b"\t"
        return len(s) + s.count(tab) * max(0, _as_int(arg, 8))  # type: ignore[arg-type]
    if name == "replace" and isinstance(s, str) and len(args) >= 2:
        return _replace_size(s, str(args[0]), str(args[1]), _as_int(
            args[2] if len(args) > 2 else kwargs.get("count", -1), -1))
    if name == "translate" and isinstance(arg, Mapping):
        longest = max((len(v) for v in arg.values() if isinstance(v, (str, bytes))), default=1)
        return len(s) * max(1, longest)
    if name == "join" and isinstance(arg, (list, tuple)):
        return budget.weight(arg) + len(arg) * len(s)
    return len(s) + budget.weight((args, kwargs))


class _CappedFormatter(SandboxedFormatter):
    """``str.format`` whose fields (widths included) are charged before they are built."""

    def __init__(self, env: BudgetedEnvironment, budget: Budget) -> None:
        super().__init__(env)
        self.budget = budget
        self.size = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        widths = sum(int(d) if len(d) <= 9 else 1 << 62
                     for d in _DIGITS.findall(format_spec))
        self.size += widths + self.budget.weight(value)
        self.budget.fits(self.size, "str.format")
        return super().format_field(value, format_spec)


def _guarded(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """Filter ``func`` with its input (and predicted output) charged before it runs."""
    skip = 0 if _PassArg.from_obj(func) is None else 1
    growth = _GROWTH.get(name, 1)

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = current()
        budget.check()
        if len(args) <= skip:
            return func(*args, **kwargs)
        value = args[skip]
        if isinstance(value, Iterator):
            value = budget.take(value)
            args = (*args[:skip], value, *args[skip + 1:])
        rest = args[skip + 1:]
        budget.fits(_filter_size(budget, name, value, rest, kwargs) * growth, f"|{name}")
        return budget.result(func(*args, **kwargs), f"|{name}")

    return guarded


def _filter_size(budget: Budget, name: str, value: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> int:
    base = budget.weight(value) + budget.weight((args, kwargs))
    arg = args[0] if args else next(iter(kwargs.values()), None)
    if name == "format" and isinstance(value, str):
        return percent_size(budget, value, kwargs or args)
    if name == "center":
        return max(base, _as_int(arg, 80))
    if name == "indent" and isinstance(value, str):
        pad = len(arg) if isinstance(arg, str) else _as_int(arg, 4)
        return len(value) + (value.count("\n") + 1) * pad
    if name == "wordwrap" and isinstance(value, str):
        wrap = kwargs.get("wrapstring", args[2] if len(args) > 2 else None) or "\n"
        return len(value) + (len(value) + 1) * len(str(wrap))
    if name == "replace" and isinstance(value, str) and len(args) >= 2:
        return _replace_size(value, str(args[0]), str(args[1]), _as_int(
            args[2] if len(args) > 2 else kwargs.get("count", -1), -1))
    if name in ("batch", "slice"):
        return base + _as_int(arg, 0)
    if name == "join" and isinstance(value, (list, tuple)):
        return base + max(0, len(value) - 1) * budget.weight(arg or "")
    return base


class _NoFolding(CodeGenerator):
    """Writes no expression's value into the code: every one is evaluated while rendering,
    inside the budget."""

    def _output_child_to_const(self, node: nodes.Expr, frame: Frame,
                               finalize: Any) -> str:
        if isinstance(node, nodes.TemplateData):
            return super()._output_child_to_const(node, frame, finalize)
        raise nodes.Impossible()


def _imported(name: str, *args: nodes.Node, lineno: int | None) -> nodes.Call:
    return nodes.Call(nodes.ImportedName(f"{__name__}.{name}"), list(args), [], None, None,
                      lineno=lineno)


class _Guard(NodeTransformer):
    """Every ``for`` iterates :func:`budgeted`, every ``~`` is :func:`joined`, and literal
    text is output through ``finalize`` (charged like any expression)."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _imported("budgeted", node.iter, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _imported("joined", *node.nodes, lineno=node.lineno)

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [nodes.Const(n.data, lineno=n.lineno) if isinstance(n, nodes.TemplateData)
                      else n for n in node.nodes]
        return node


def guard(template: nodes.Template) -> nodes.Template:
    """``template`` rewritten so its loops, concatenations and text are charged."""
    out = _Guard().visit(template)
    assert isinstance(out, nodes.Template)
    return out


class BudgetedEnvironment(ImmutableSandboxedEnvironment):
    """Immutable sandbox (no ``append``/``update`` on lists and dicts) charging a
    :class:`Budget`; compile with :meth:`compile_guarded`."""

    code_generator_class = _NoFolding
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self) -> None:
        super().__init__(undefined=StrictUndefined, autoescape=False, optimized=False,
                         finalize=_finalize)
        self.globals["range"] = _range
        self.globals.pop("lipsum", None)
        self.filters = {name: _guarded(name, f) for name, f in self.filters.items()}

    def compile_guarded(self, template: nodes.Template) -> Any:
        """A ``jinja2.Template`` of the parsed ``template`` (rewritten by :func:`guard`)."""
        code = self.compile(guard(template))
        return self.template_class.from_code(self, code, self.make_globals(None), None)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = current()
        budget.check()
        if operator == "**":
            self._power(budget, left, right)
        elif operator == "*":
            self._product(budget, left, right)
        elif operator == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                budget.fits(len(left) + len(right), "+")
        elif operator == "%" and isinstance(left, str):
            budget.fits(percent_size(budget, left, right), "%")
        return budget.result(self.binop_table[operator](left, right), operator)

    @staticmethod
    def _power(budget: Budget, base: Any, exp: Any) -> None:
        if isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base) > 1:
            budget.bits(exp * base.bit_length() if exp < 1 << 32 else 1 << 62, "**")

    @staticmethod
    def _product(budget: Budget, left: Any, right: Any) -> None:
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
                budget.fits(len(seq) * n, "*")
        if isinstance(left, int) and isinstance(right, int):
            budget.bits(left.bit_length() + right.bit_length(), "*")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        if not (isinstance(value, (types.MethodType, types.BuiltinMethodType))
                and value.__name__ in ("format", "format_map")
                and isinstance(value.__self__, str)):
            return None
        fmt: str = value.__self__
        mapping = value.__name__ == "format_map"

        def capped(*args: Any, **kwargs: Any) -> str:
            formatter = _CappedFormatter(self, current())
            if mapping:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                kwargs, args = args[0], ()
            return type(fmt)(formatter.vformat(fmt, args, kwargs))

        return functools.update_wrapper(capped, value)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = current()
        budget.check()
        if isinstance(obj, LoopContext) and args:
            args = (budgeted(args[0]), *args[1:])
        elif isinstance(obj, types.BuiltinMethodType) and isinstance(obj.__self__,
                                                                      (str, bytes)):
            if obj.__name__ == "join" and args and not isinstance(args[0], (list, tuple)):
                args = (budget.take(args[0]), *args[1:])
            budget.fits(_str_method_size(budget, obj.__self__, obj.__name__, args, kwargs),
                        f"str.{obj.__name__}")
        budget.depth += 1
        try:
            if budget.depth > budget.limits.max_depth:
                raise BudgetExceeded(f"calls nested deeper than {budget.limits.max_depth}")
            return budget.result(super().call(context, obj, *args, **kwargs), "call")
        finally:
            budget.depth -= 1


