"""Hypothesis strategies for the sampling fields a client or a head may send.

The tracker and every node must accept exactly the same values: both sides'
property tests draw from these, so a range that drifts on one side is found.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from nodes_app.protocol.sampling import TOP_P_MIN

ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.0, max_value=3.0),
    st.sampled_from([0.0, 1e-46, 1e-7, TOP_P_MIN, 1.0, 2.0, 2**63 - 1, 2**63, 2**64]),
    st.text(max_size=4),
)
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed")
SAMPLING: st.SearchStrategy[dict[str, Any]] = st.dictionaries(
    st.sampled_from(SAMPLING_FIELDS), ANY_VALUE
)
