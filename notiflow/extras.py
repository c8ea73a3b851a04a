"""The optional dependency groups (``pyproject.toml``'s extras) and the error a feature raises
when the group it needs is not installed: the core install (``pip install notiflow``) runs the
platform's processes; ``emulators``, ``archive`` and ``ses`` add the provider emulators and
their test TLS material, the history archive's Parquet files, and Amazon SES's request
signing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class MissingExtra(RuntimeError):
    """``feature`` needs a package of the extra ``extra``, which is not installed."""

    def __init__(self, feature: str, extra: str, missing: str | None) -> None:
        super().__init__(f"{feature} needs {missing or 'a package'} from notiflow's {extra!r} "
                         f"extra: pip install -c constraints.txt 'notiflow[{extra}]' "
                         f"(in a clone: -e '.[{extra}]')")
        self.feature, self.extra, self.missing = feature, extra, missing


@contextmanager
def needs(extra: str, feature: str) -> Iterator[None]:
    """Imports inside this block come from ``extra``: a missing module raises
    :class:`MissingExtra`, which names the extra to install."""
    try:
        yield
    except ModuleNotFoundError as e:
        raise MissingExtra(feature, extra, e.name) from e
