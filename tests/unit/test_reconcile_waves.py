"""The reconciler applies a batch in waves whose width is read at the start of each wave
(the bulk window narrows while P0 is slow)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from notiflow.flows.receipts.reconcile import _waves


@given(st.integers(0, 60), st.lists(st.integers(-2, 9), min_size=1, max_size=40))
def test_waves_keep_order_and_follow_the_width_of_their_moment(n: int, widths: list[int]
                                                                ) -> None:
    groups = {f"m{i}": [i] for i in range(n)}
    asked = iter(widths * 60)
    seen: list[int] = []

    def width() -> int:
        seen.append(next(asked))
        return seen[-1]

    waves = list(_waves(groups, width))
    assert [k for w in waves for k in w] == list(groups)
    assert len(seen) == len(waves)
    for wave, w in zip(waves[:-1], seen, strict=False):
        assert len(wave) == max(1, w)
    if waves:
        assert 1 <= len(waves[-1]) <= max(1, seen[-1])
