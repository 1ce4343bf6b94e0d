"""Plan signatures (``nodes_app.shared.signing``): any change after signing fails verification, a
plan signature is never a registration signature, the tracker's key is created once.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from meshnet_site.environment import PLAN_VALIDITY
from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.limits import MAX_PLAN_VALIDITY
from nodes_app.protocol.signed_plan import SignedPlan
from nodes_app.shared.signing import (
    load_or_create_wallet,
    public_key_from_hex,
    sign_plan,
    verify_plan,
    verify_registration,
    wallet_of,
)
from tests.support.nodes import TINY
from tests.support.plans import signed_plan


def test_threads_creating_the_key_at_once_all_read_the_one_key_that_won(
    tmp_path: Path,
) -> None:
    """A tracker's first requests (several nodes registering at once) create the key side by
    side in one process; none may read a half-written or vanished draft."""
    paths = [tmp_path / f"tracker_key_{attempt}" for attempt in range(50)]
    for path in paths:
        with ThreadPoolExecutor(4) as pool:
            keys = list(pool.map(lambda p: wallet_of(load_or_create_wallet(p)), [path] * 4))

        assert keys == [wallet_of(load_or_create_wallet(path))] * 4
    assert sorted(tmp_path.iterdir()) == sorted(paths)


TRACKER = Ed25519PrivateKey.generate()
TRACKER_HEX = wallet_of(TRACKER)

hop_strategy: st.SearchStrategy[dict[str, Any]] = st.builds(
    dict,
    node_id=st.text(min_size=1, max_size=20),
    endpoint=st.text(max_size=40),
    start_layer=st.integers(0, 100),
    end_layer=st.integers(0, 100),
)
fields_strategy = st.fixed_dictionaries(
    {
        "request_id": st.text(min_size=1, max_size=40),
        "model": st.text(min_size=1, max_size=20),
        "hops": st.lists(hop_strategy, min_size=1, max_size=4),
        "expires_at": st.integers(0, 2**40),
        "max_positions": st.integers(0, 2**20),
        "ends_at": st.integers(0, 2**40),
        "idle_seconds": st.integers(0, 2**20),
        "nonce": st.text("0123456789abcdef", max_size=32),
    }
)


def different(value: Any) -> Any:
    return value + 1 if isinstance(value, int) else value + "x"


def altered(fields: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    """``fields`` with exactly one thing changed: a field, a hop's field, a hop added or gone."""
    changed = {**fields, "hops": [dict(hop) for hop in fields["hops"]]}
    what = data.draw(
        st.sampled_from(
            [
                "request_id",
                "model",
                "expires_at",
                "max_positions",
                "ends_at",
                "idle_seconds",
                "nonce",
                "hop",
                "extra",
                "drop",
            ]
        )
    )
    if what == "hop":
        hop = data.draw(st.sampled_from(changed["hops"]))
        name = data.draw(st.sampled_from(sorted(hop)))
        hop[name] = different(hop[name])
    elif what == "extra":
        changed["hops"].append(data.draw(hop_strategy))
    elif what == "drop":
        changed["hops"].pop(data.draw(st.integers(0, len(changed["hops"]) - 1)))
    else:
        changed[what] = different(changed[what])
    return changed


@given(fields=fields_strategy, data=st.data())
def test_any_field_altered_after_signing_fails_verification(
    fields: dict[str, Any], data: st.DataObject
) -> None:
    signature = sign_plan(TRACKER, fields)
    public = public_key_from_hex(TRACKER_HEX)

    assert verify_plan(public, fields, signature)
    assert not verify_plan(public, altered(fields, data), signature)
    assert not verify_plan(public_key_from_hex(wallet_of(Ed25519PrivateKey.generate())),
                           fields, signature)  # fmt: skip


def test_the_tracker_never_signs_a_plan_for_longer_than_nodes_accept() -> None:
    assert PLAN_VALIDITY.maximum == MAX_PLAN_VALIDITY


def test_a_plan_signature_is_no_registration_signature() -> None:
    fields = {"request_id": "r", "model": "m", "hops": [], "expires_at": 1, "nonce": ""}
    assert not verify_registration(TRACKER_HEX, fields, sign_plan(TRACKER, fields))


def test_a_plan_travels_in_its_header_unchanged_and_a_mangled_header_is_a_400() -> None:
    hops = [
        {"node_id": "head", "endpoint": "http://h", "start_layer": 0, "end_layer": 1},
        {"node_id": "tail", "endpoint": "http://t", "start_layer": 2, "end_layer": 3},
    ]
    sealed = signed_plan(TRACKER, request_id="r", model=TINY, hops=hops)
    assert SignedPlan.from_header(sealed.to_header()) == sealed
    for mangled in ("not base64 !", sealed.to_header()[:-8], "e30"):
        with pytest.raises(ProtocolError) as caught:
            SignedPlan.from_header(mangled)
        assert caught.value.code == "invalid_plan"
