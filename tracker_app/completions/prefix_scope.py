"""The prefix scope every plan the tracker signs carries (ADR-0027, "Tracker").

Nodes reuse a cached prompt prefix only within the scope the signed plan
names. By default that is the request's API key: ``key:`` and an HMAC-SHA256
of the key's primary key under ``settings.SECRET_KEY`` (which every tracker
process of a deployment shares), truncated to :data:`SCOPE_DIGEST_HEX` hex
digits — stable across processes, different between keys, and telling a node
nothing of the key. A model whose operator allows sharing
(``LanguageModel.prefix_cache_shared``: public system prompts) is scoped
``shared:<model key>`` for every key: a hit is faster than a miss, so a shared
cache tells one key what prompts others sent (docs/SECURITY.md).
"""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings

from nodes_app.protocol.limits import PREFIX_MAX_SCOPE

# 128 bits: no two keys of a deployment share a scope by accident.
SCOPE_DIGEST_HEX = 32
# Keeps the scope's MAC apart from any other use of the secret.
_PURPOSE = b"meshnet prefix scope\x00"


def prefix_scope(*, api_key_id: object, model_key: str, shared: bool) -> str:
    """The scope of a request by the key whose primary key is ``api_key_id`` to the
    model ``model_key`` (``shared``: its operator lets keys share its cache)."""
    if shared:
        scope = f"shared:{model_key}"
    else:
        mac = hmac.new(
            settings.SECRET_KEY.encode(), _PURPOSE + str(api_key_id).encode(), hashlib.sha256
        )
        scope = f"key:{mac.hexdigest()[:SCOPE_DIGEST_HEX]}"
    return scope[:PREFIX_MAX_SCOPE]
