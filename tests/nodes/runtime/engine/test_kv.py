"""Per-session K/V buffers, the batch cache and its masks, against plain tensor arithmetic."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes_app.runtime.engine.kv import MIN_CAPACITY, BatchCache, SessionKV, attention_mask

HEADS, DIM = 2, 4


def kv_rows(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, HEADS, length, DIM, generator=generator),
        torch.randn(batch, HEADS, length, DIM, generator=generator),
    )


def test_appends_return_the_whole_past_as_views_of_one_buffer() -> None:
    kv = SessionKV()
    key, value = kv_rows(1, 3, seed=1)
    kv.append(0, key, value)
    step_key, step_value = kv_rows(1, 1, seed=2)
    keys, values = kv.append(0, step_key, step_value)

    torch.testing.assert_close(keys, torch.cat([key, step_key], dim=2))
    torch.testing.assert_close(values, torch.cat([value, step_value], dim=2))
    assert kv.length(0) == 4 and kv.length(1) == 0
    # No copy per step: the answer is a view of the session's buffer.
    assert (
        keys.untyped_storage().data_ptr()
        == kv.append(0, *kv_rows(1, 1, 3))[0].untyped_storage().data_ptr()
    )


def test_buffers_grow_by_doubling_and_not_past_the_reservation() -> None:
    unlimited, reserved = SessionKV(), SessionKV(limit=40)
    for kv in (unlimited, reserved):
        for step in range(33):
            kv.append(0, *kv_rows(1, 1, step))
    per_position = 2 * HEADS * DIM * 4
    assert unlimited.nbytes == 4 * MIN_CAPACITY * per_position  # 16 → 32 → 64
    assert reserved.nbytes == 40 * per_position


@settings(max_examples=40, deadline=None)
@given(
    pasts=st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=4),
    length=st.integers(min_value=1, max_value=3),
    window=st.one_of(st.none(), st.integers(min_value=1, max_value=8)),
)
def test_the_mask_lets_each_query_see_exactly_its_own_rows_causal_window(
    pasts: list[int], length: int, window: int | None
) -> None:
    mask = attention_mask(pasts, length, window=window, device=torch.device("cpu"))
    longest = max(pasts) + length
    for row, past in enumerate(pasts):
        for offset in range(length):
            query = past + offset
            expected = [
                key <= query and (window is None or key > query - window) for key in range(longest)
            ]
            if mask is None:
                # Only a lone row that sdpa attends right without one: one query
                # (it sees every key) or no past (sdpa's own is_causal), no window reached.
                assert len(pasts) == 1 and (length == 1 or past == 0)
                assert expected == [key <= query for key in range(longest)]
            else:
                assert mask.shape == (len(pasts), 1, length, longest)
                assert mask[row, 0, offset].tolist() == expected


def test_a_lone_prefill_after_a_past_gets_a_mask_sdpa_would_otherwise_crop() -> None:
    mask = attention_mask([5], 3, window=None, device=torch.device("cpu"))
    assert mask is not None
    assert mask[0, 0].sum(dim=-1).tolist() == [6, 7, 8]


@settings(max_examples=25, deadline=None)
@given(pasts=st.lists(st.integers(min_value=0, max_value=6), min_size=2, max_size=4))
def test_a_batched_update_pads_each_rows_context_and_keeps_sessions_apart(pasts: list[int]) -> None:
    sessions = [SessionKV() for _ in pasts]
    history = []
    for index, (kv, past) in enumerate(zip(sessions, pasts, strict=True)):
        key, value = kv_rows(1, past, seed=index) if past else kv_rows(1, 0, seed=index)
        if past:
            kv.append(3, key, value)
        history.append((key, value))
    new_keys, new_values = kv_rows(len(pasts), 1, seed=99)
    keys, values = BatchCache(sessions).update(new_keys, new_values, 3)

    assert keys.shape == (len(pasts), HEADS, max(pasts) + 1, DIM)
    for row, (past, (key, value)) in enumerate(zip(pasts, history, strict=True)):
        whole_key = torch.cat([key, new_keys[row : row + 1]], dim=2)[0]
        whole_value = torch.cat([value, new_values[row : row + 1]], dim=2)[0]
        torch.testing.assert_close(keys[row, :, : past + 1], whole_key)
        torch.testing.assert_close(values[row, :, : past + 1], whole_value)
        assert sessions[row].length(3) == past + 1
