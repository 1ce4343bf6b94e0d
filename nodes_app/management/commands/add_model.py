"""``manage.py add_model KEY --weights PATH``: add a model the network may serve (model_intake)."""

from __future__ import annotations

import argparse
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from nodes_app.model_intake import ModelRefused, language_model_add


def _price(value: str) -> Decimal:
    try:
        return Decimal(value)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"must be a decimal number, not {value!r}") from None


class Command(BaseCommand):
    help = (
        "Add a model the network may serve: its layer count, context length and tokenizer are "
        "read from the weights (a Hugging Face directory or a .gguf file); refuses what the "
        "runtime cannot serve, with the reason. Running it again with the same weights is a no-op."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("key", help="the model's key, e.g. qwen3-8b (what clients send)")
        parser.add_argument("--weights", required=True, help="a local directory or .gguf file")
        parser.add_argument("--name", default="", help="display name (default: the key)")
        parser.add_argument("--prompt-price", type=_price, default=Decimal("0"), help="per 1k")
        parser.add_argument("--completion-price", type=_price, default=Decimal("0"), help="per 1k")
        parser.add_argument(
            "--draft",
            metavar="KEY",
            help="a catalogue model with the same tokenizer that heads run to guess this "
            "model's next tokens (speculative decoding); set on the model even if it exists",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            model = language_model_add(
                key=options["key"],
                weight_source=options["weights"],
                display_name=options["name"],
                prompt_price_per_1k=options["prompt_price"],
                completion_price_per_1k=options["completion_price"],
                draft=options["draft"],
            )
        except ModelRefused as refused:
            raise CommandError(f"model {options['key']} refused: {refused.message}") from None
        context = model.context_length or "not stated"
        self.stdout.write(
            f"model {model.key}: layers 0-{model.last_layer} ({model.num_layers}), "
            f"context {context}, weights {model.weight_source}"
            + (f", draft {model.draft.key}" if model.draft is not None else "")
        )
