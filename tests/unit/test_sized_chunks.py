"""`sql_chunks.sized_chunks`: slices bounded by count and by bytes, in order, none lost."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from taskstream.core.store.sql_chunks import CHUNK, sized_chunks, text_size


def test_slices_close_before_the_byte_budget_and_at_the_count_limit() -> None:
    sizes = [3, 3, 3, 9, 1, 1]
    assert [list(s) for s in sized_chunks(range(6), sizes, max_bytes=6)] == [
        [0, 1],
        [2],
        [3],  # larger than the budget on its own: a slice of one
        [4, 5],
    ]
    many = list(sized_chunks(range(CHUNK + 1), [0] * (CHUNK + 1), max_bytes=1))
    assert [len(s) for s in many] == [CHUNK, 1]


@given(st.lists(st.integers(min_value=0, max_value=50), max_size=500), st.integers(1, 120))
def test_every_item_once_in_order_within_both_bounds(sizes: list[int], budget: int) -> None:
    slices = [list(s) for s in sized_chunks(range(len(sizes)), sizes, max_bytes=budget)]
    assert [i for s in slices for i in s] == list(range(len(sizes)))
    for s in slices:
        assert 1 <= len(s) <= CHUNK
        assert len(s) == 1 or sum(sizes[i] for i in s) <= budget


def test_a_rows_size_counts_its_text_values_only() -> None:
    assert text_size({"payload": '{"a":1}', "attempt": 3, "owner": None, "id": "i_1"}) == 10
