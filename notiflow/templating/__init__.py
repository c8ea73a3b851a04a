"""Message templates: declared variables, content checksum, budgeted sandboxed rendering.

Shared by the Messaging API (validation at acceptance) and the send dataflow (rendering).
Templates are Jinja2 sources rendered in an immutable sandbox (``templating/sandbox.py``)
with ``StrictUndefined`` and no autoescaping (SMS and push bodies are plain text). No
expression is evaluated at compile time; every render runs within a
:class:`~notiflow.settings.RenderLimits` budget (CPU time, output and value sizes, loop
iterations, call depth). Compiled templates are cached by content checksum, so an immutable
template version compiles once per process.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import jinja2
from jinja2 import nodes

from notiflow.settings import RenderLimits
from notiflow.templating.sandbox import Budget, BudgetedEnvironment, BudgetExceeded, active
from notiflow.templating.walk import undeclared_variables

CACHE_SIZE = 1024
DEFAULT_LIMITS = RenderLimits()

_env = BudgetedEnvironment()
_GLOBALS = frozenset(_env.globals)
Clock = Callable[[], float]


class TemplateError(ValueError):
    """A template cannot be used (bad syntax, or rendering failed)."""


class TemplateSyntaxError(TemplateError):
    """The template source does not parse; ``field`` is ``"subject"`` or ``"body"``."""

    def __init__(self, field: str, message: str, lineno: int | None) -> None:
        self.field = field
        self.lineno = lineno
        where = f" (line {lineno})" if lineno else ""
        super().__init__(f"{field}: {message}{where}")


class TemplateRefused(TemplateError):
    """The template parses but is refused by the sandbox whatever its variables (a literal
    expression over the render budget, or too deeply nested to compile)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class RenderError(TemplateError):
    """Rendering failed for a reason other than a missing variable (e.g. sandbox violation,
    the render budget)."""


class OverBudget(RenderError):
    """The render ran out of CPU time or loop iterations."""


class MissingVariable(RenderError):
    """Variables the template needs were not supplied; ``name`` is the first of ``names``."""

    def __init__(self, names: str | tuple[str, ...]) -> None:
        self.names: tuple[str, ...] = (names,) if isinstance(names, str) else tuple(names)
        self.name = self.names[0]
        super().__init__(f"missing template variable(s): {', '.join(self.names)}")


@dataclass(frozen=True, slots=True)
class TemplateInfo:
    """What :func:`analyse` learns about a template's content."""

    variables: tuple[str, ...]
    checksum: str


def checksum(subject: str | None, body: str) -> str:
    """Hex SHA-256 of the content (subject and body); equal content gives equal checksums."""
    canonical = json.dumps({"subject": subject, "body": body}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def version_checksum(default: str, variants: Mapping[str, str]) -> str:
    """The checksum of a template version: its default content's (``default``) when it has
    no locale variants, else of that and each variant's checksum by tag."""
    if not variants:
        return default
    canonical = json.dumps({"default": default, "locales": dict(sorted(variants.items()))},
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _parse(field: str, source: str) -> nodes.Template:
    try:
        return _env.parse(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateSyntaxError(field, exc.message or "syntax error", exc.lineno) from None
    except (RecursionError, MemoryError):
        raise TemplateSyntaxError(field, "nested too deeply", None) from None
    except (ValueError, OverflowError) as exc:
        raise TemplateSyntaxError(field, f"invalid literal: {exc}", None) from None


def _variables(field: str, ast: nodes.Template) -> set[str]:
    try:
        return undeclared_variables(ast) - _GLOBALS
    except RecursionError:
        raise TemplateSyntaxError(field, "nested too deeply", None) from None


def _fields(subject: str | None, body: str) -> list[tuple[str, str]]:
    return [("body", body)] + ([("subject", subject)] if subject is not None else [])


def analyse(subject: str | None, body: str) -> TemplateInfo:
    """Declared variables (sorted) and checksum; raises :class:`TemplateSyntaxError`.
    Evaluates nothing: cost grows with the source's length only."""
    names: set[str] = set()
    for field, source in _fields(subject, body):
        names |= _variables(field, _parse(field, source))
    return TemplateInfo(tuple(sorted(names)), checksum(subject, body))


def check(subject: str | None, body: str,
          limits: RenderLimits = DEFAULT_LIMITS) -> TemplateInfo:
    """:func:`analyse`, then a test compile and the literal expressions evaluated within
    ``limits``: raises :class:`TemplateSyntaxError` or :class:`TemplateRefused`. CPU-bound
    (milliseconds for a large source): run it off an event loop."""
    info = analyse(subject, body)
    for field, source in _fields(subject, body):
        ast = _parse(field, source)
        try:
            _env.compile_guarded(ast)
        except RecursionError:
            raise TemplateRefused(field, "nested too deeply to compile") from None
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateSyntaxError(field, exc.message or "syntax error",
                                      exc.lineno) from None
        except Exception as exc:
            raise TemplateRefused(field, f"does not compile: {type(exc).__name__}") from None
        refusal = _literal_refusal(_parse(field, source), limits)
        if refusal is not None:
            raise TemplateRefused(field, refusal)
    return info


class _NotLiteral(Exception):
    pass


def _literal(node: nodes.Node) -> Any:
    if isinstance(node, nodes.Const):
        return node.value
    if isinstance(node, (nodes.List, nodes.Tuple)):
        return [_literal(item) for item in node.items]
    if isinstance(node, nodes.Neg):
        return -_literal(node.node)
    if isinstance(node, nodes.BinExpr):
        left, right = _literal(node.left), _literal(node.right)
        if node.operator in _env.intercepted_binops:
            return _env.call_binop(None, node.operator, left, right)
        return _env.binop_table[node.operator](left, right)
    if (isinstance(node, nodes.Filter) and node.node is not None and not node.kwargs
            and node.dyn_args is None and node.dyn_kwargs is None
            and node.name in _env.filters):
        func = _env.filters[node.name]
        if getattr(func, "jinja_pass_arg", None) is None:
            return func(_literal(node.node), *(_literal(a) for a in node.args))
    raise _NotLiteral


def _literal_refusal(ast: nodes.Template, limits: RenderLimits) -> str | None:
    """Why an expression made of literals only is over budget, if one is."""
    todo: list[nodes.Node] = [ast]
    with active(Budget(limits, time.thread_time)):
        while todo:
            node = todo.pop()
            if isinstance(node, (nodes.BinExpr, nodes.Filter)):
                try:
                    _literal(node)
                    continue
                except BudgetExceeded as exc:
                    return str(exc)
                except Exception:
                    pass
            todo.extend(node.iter_child_nodes())
    return None


def missing_variables(declared: tuple[str, ...] | list[str] | None,
                      variables: Mapping[str, Any]) -> tuple[str, ...]:
    """Declared names absent from ``variables`` (``None`` values count as supplied)."""
    return tuple(name for name in declared or () if name not in variables)


@dataclass(frozen=True, slots=True)
class _Compiled:
    subject: jinja2.Template | None
    body: jinja2.Template
    variables: tuple[str, ...]


_cache: OrderedDict[str, _Compiled] = OrderedDict()
_lock = threading.Lock()


def _compile(subject: str | None, body: str, digest: str | None) -> _Compiled:
    key = digest or checksum(subject, body)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    names: set[str] = set()
    templates: dict[str, jinja2.Template] = {}
    for field, source in _fields(subject, body):
        ast = _parse(field, source)
        names |= _variables(field, ast)
        templates[field] = _env.compile_guarded(ast)
    compiled = _Compiled(templates.get("subject"), templates["body"], tuple(sorted(names)))
    with _lock:
        _cache[key] = compiled
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return compiled


def _generate(template: jinja2.Template, variables: Mapping[str, Any],
              budget: Budget) -> str:
    parts: list[str] = []
    size, limit = 0, budget.limits.max_output
    for chunk in template.root_render_func(template.new_context(dict(variables))):
        size += len(chunk)
        if size > limit:
            budget.fits(size, "rendered output")
        parts.append(chunk)
    return "".join(parts)


def _render_once(compiled: _Compiled, variables: Mapping[str, Any], limits: RenderLimits,
                 clock: Clock) -> tuple[str | None, str]:
    with active(Budget(limits, clock)) as budget:
        subject = (_generate(compiled.subject, variables, budget)
                   if compiled.subject is not None else None)
        return subject, _generate(compiled.body, variables, budget)


class StoredTemplate(Protocol):
    """A stored template version as :func:`render` reads it (``checksum`` empty or None:
    computed)."""

    @property
    def subject(self) -> str | None: ...

    @property
    def body(self) -> str: ...

    @property
    def checksum(self) -> str | None: ...


def render(template: StoredTemplate, variables: Mapping[str, Any],
           limits: RenderLimits = DEFAULT_LIMITS,
           clock: Clock = time.thread_time) -> tuple[str | None, str]:
    """Render a stored template version within ``limits`` (``clock``: CPU seconds of the
    calling thread).

    Returns ``(subject, body)``; raises :class:`MissingVariable` naming every absent variable,
    :class:`OverBudget` when CPU time (twice in a row: one overrun can be a pause of the
    process) or loop iterations ran out and :class:`RenderError` for
    any other failure (a stored template that does not parse, a size cap, the sandbox, any
    exception of the template's own code). Nothing else escapes.
    """
    try:
        compiled = _compile(template.subject, template.body, template.checksum)
    except TemplateError as exc:
        raise RenderError(f"template does not parse: {exc}") from None
    except Exception as exc:
        raise RenderError(f"template does not compile: {type(exc).__name__}") from None
    absent = missing_variables(compiled.variables, variables)
    if absent:
        raise MissingVariable(absent)
    try:
        try:
            return _render_once(compiled, variables, limits, clock)
        except BudgetExceeded as exc:
            if not exc.cpu:
                raise
            return _render_once(compiled, variables, limits, clock)
    except BudgetExceeded as exc:
        if exc.spent:
            raise OverBudget(f"over the render budget: {exc}") from None
        raise RenderError(f"over the render budget: {exc}") from None
    except jinja2.UndefinedError as exc:
        raise RenderError(f"undefined value while rendering: {exc.message}") from None
    except jinja2.exceptions.SecurityError as exc:
        raise RenderError(f"template not allowed by the sandbox: {exc}") from None
    except RecursionError:
        raise RenderError("render failed: nested too deeply") from None
    except MemoryError:
        raise RenderError("render failed: out of memory") from None
    except Exception as exc:
        raise RenderError(f"render failed: {type(exc).__name__}: {exc}"[:500]) from None


def cache_info() -> int:
    """Number of compiled templates currently cached."""
    with _lock:
        return len(_cache)
