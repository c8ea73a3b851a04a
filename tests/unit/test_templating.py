"""notiflow.templating: declared variables, checksum, sandboxed strict rendering."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from notiflow import templating
from notiflow.templating import (
    MissingVariable,
    RenderError,
    TemplateSyntaxError,
    analyse,
    checksum,
    missing_variables,
    render,
)


@dataclass(frozen=True)
class Stored:
    """A stored template version as ``render`` reads it."""

    body: str
    subject: str | None = None
    checksum: str | None = None


def row(body: str, subject: str | None = None) -> Stored:
    return Stored(body, subject, checksum(subject, body))


def test_variables_are_collected_from_subject_and_body_sorted() -> None:
    info = analyse("Order {{ order_id }}", "Hi {{ name }}, order {{ order_id }} ships {{ eta }}")
    assert info.variables == ("eta", "name", "order_id")


def test_locals_loop_variables_and_globals_are_not_required() -> None:
    body = ("{% set greeting = 'Hi' %}{{ greeting }} {% for i in items %}{{ i }}{% endfor %}"
            "{% for n in range(2) %}{{ loop.index }}{% endfor %}")
    assert analyse(None, body).variables == ("items",)


def test_checksum_depends_on_subject_and_body_only() -> None:
    assert checksum(None, "a") == checksum(None, "a")
    assert checksum(None, "a") != checksum("", "a")
    assert checksum("s", "a") != checksum("s", "b")
    assert analyse("s", "a").checksum == checksum("s", "a")
    assert len(checksum(None, "a")) == 64


def test_syntax_error_names_field_and_line() -> None:
    with pytest.raises(TemplateSyntaxError) as exc:
        analyse(None, "line one\n{{ code }")
    assert exc.value.field == "body"
    assert exc.value.lineno == 2
    with pytest.raises(TemplateSyntaxError) as exc:
        analyse("{% if %}", "ok")
    assert exc.value.field == "subject"


def test_render_subject_and_body() -> None:
    assert render(row("Code {{ code }}", "Hello {{ name }}"), {"code": 1234, "name": "Ann"}) == (
        "Hello Ann", "Code 1234")
    assert render(row("plain"), {}) == (None, "plain")


def test_no_autoescape() -> None:
    assert render(row("{{ v }}"), {"v": "<b>&"}) == (None, "<b>&")


def test_missing_variable_names_every_absent_variable() -> None:
    with pytest.raises(MissingVariable) as exc:
        render(row("{{ a }} {{ b }} {{ c }}"), {"b": "x"})
    assert exc.value.names == ("a", "c")
    assert exc.value.name == "a"
    assert "a, c" in str(exc.value)


def test_none_counts_as_supplied() -> None:
    assert missing_variables(("a",), {"a": None}) == ()
    assert render(row("[{{ a }}]"), {"a": None}) == (None, "[None]")


def test_strict_undefined_attribute_is_a_render_error() -> None:
    with pytest.raises(RenderError) as exc:
        render(row("{{ user.name }}"), {"user": "plain string"})
    assert not isinstance(exc.value, MissingVariable)


def test_sandbox_blocks_unsafe_attribute_access() -> None:
    with pytest.raises(RenderError):
        render(row("{{ x.__class__.__mro__[1].__subclasses__() }}"), {"x": ""})


def test_compiled_templates_are_cached_by_checksum() -> None:
    body = "cached {{ v }} 7f3a"
    render(row(body), {"v": 1})
    size = templating.cache_info()
    assert render(row(body), {"v": 2}) == (None, "cached 2 7f3a")
    assert templating.cache_info() == size


def test_row_without_checksum_still_renders() -> None:
    assert render(Stored("x {{ y }}"), {"y": "z"}) == (None, "x z")


def test_render_of_a_template_that_does_not_parse_is_a_render_error() -> None:
    with pytest.raises(RenderError) as exc:
        render(row("{{ broken"), {})
    assert not isinstance(exc.value, MissingVariable)
