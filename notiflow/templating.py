"""Message templates: declared variables, content checksum, sandboxed rendering.

Shared by the Messaging API (validation at acceptance) and the send dataflow (rendering).
Templates are Jinja2 sources rendered in a :class:`~jinja2.sandbox.SandboxedEnvironment`
with ``StrictUndefined`` and no autoescaping (SMS and push bodies are plain text). Compiled
templates are cached by content checksum, so an immutable template version compiles once per
process.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import StrictUndefined, meta
from jinja2.sandbox import SandboxedEnvironment

CACHE_SIZE = 1024

_env = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
_GLOBALS = frozenset(_env.globals)


class TemplateError(ValueError):
    """A template cannot be used (bad syntax, or rendering failed)."""


class TemplateSyntaxError(TemplateError):
    """The template source does not parse; ``field`` is ``"subject"`` or ``"body"``."""

    def __init__(self, field: str, message: str, lineno: int | None) -> None:
        self.field = field
        self.lineno = lineno
        where = f" (line {lineno})" if lineno else ""
        super().__init__(f"{field}: {message}{where}")


class RenderError(TemplateError):
    """Rendering failed for a reason other than a missing variable (e.g. sandbox violation)."""


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


def _parse_variables(field: str, source: str) -> set[str]:
    try:
        ast = _env.parse(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateSyntaxError(field, exc.message or "syntax error", exc.lineno) from None
    return set(meta.find_undeclared_variables(ast)) - _GLOBALS


def analyse(subject: str | None, body: str) -> TemplateInfo:
    """Declared variables (sorted) and checksum; raises :class:`TemplateSyntaxError`."""
    names = _parse_variables("body", body)
    if subject is not None:
        names |= _parse_variables("subject", subject)
    return TemplateInfo(tuple(sorted(names)), checksum(subject, body))


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
    info = analyse(subject, body)
    compiled = _Compiled(
        _env.from_string(subject) if subject is not None else None,
        _env.from_string(body),
        info.variables,
    )
    with _lock:
        _cache[key] = compiled
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return compiled


def render(template_row: Mapping[str, Any],
           variables: Mapping[str, Any]) -> tuple[str | None, str]:
    """Render a stored template version (``subject``, ``body``, optional ``checksum``).

    Returns ``(subject, body)``; raises :class:`MissingVariable` naming every absent variable
    and :class:`RenderError` for any other failure (including a stored template that does
    not parse).
    """
    try:
        compiled = _compile(template_row.get("subject"), template_row["body"],
                            template_row.get("checksum"))
    except TemplateSyntaxError as exc:
        raise RenderError(f"template does not parse: {exc}") from None
    absent = missing_variables(compiled.variables, variables)
    if absent:
        raise MissingVariable(absent)
    try:
        subject = compiled.subject.render(variables) if compiled.subject is not None else None
        return subject, compiled.body.render(variables)
    except jinja2.UndefinedError as exc:
        raise RenderError(f"undefined value while rendering: {exc.message}") from None
    except jinja2.exceptions.SecurityError as exc:
        raise RenderError(f"template not allowed by the sandbox: {exc}") from None
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise RenderError(f"render failed: {type(exc).__name__}: {exc}") from None


def cache_info() -> int:
    """Number of compiled templates currently cached."""
    with _lock:
        return len(_cache)
