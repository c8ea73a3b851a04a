"""The metric names a PromQL expression selects (enough PromQL for our rules and dashboards).

Strings, label matchers, range/subquery brackets, numbers and durations and grouping clauses
(``by (…)``, ``on (…)``, …) are removed first; what remains that is an identifier, not a
keyword and not followed by ``(`` (a function or aggregation) is a metric name.
"""

from __future__ import annotations

import re

_KEYWORDS = frozenset({
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
    "group_right", "inf", "nan", "atan2", "start", "end",
})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?"
                     r"(?:ms|[smhdwy])?(?:\d+(?:ms|[smhdwy]))*)(?![\w:])")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_GRAFANA_VARS = re.compile(r"\$__\w+|\$\{[^}]*\}|\$\w+")


def metric_names(expr: str) -> set[str]:
    """Metric names selected by ``expr`` (Grafana ``$variables`` are ignored)."""
    s = _GRAFANA_VARS.sub("1", expr)
    s = _STRING.sub(" ", s)
    selectors_by_name = re.findall(r"\{[^{}]*__name__\s*=\s*\"([^\"]+)\"", expr)
    s = _MATCHERS.sub(" ", s)
    s = _BRACKETS.sub(" ", s)
    s = _GROUPING.sub(" ", s)
    s = _NUMBER.sub(" ", s)
    names = set(selectors_by_name)
    for m in _IDENT.finditer(s):
        word = m.group(0)
        if word.lower() in _KEYWORDS:
            continue
        if re.match(r"\s*\(", s[m.end():]):
            continue
        names.add(word)
    return names
