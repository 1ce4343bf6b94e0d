"""A model's draft model (ADR-0028): named with ``add_model --draft`` or in the admin, refused
unless it shares the model's tokenizer, and named to nodes in the registration answer."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework import status
from rest_framework.test import APIClient

from nodes_app.models import LanguageModel
from tracker_app.localnet.stand_in_nodes import ChallengeResponder, proven_registration

pytestmark = pytest.mark.django_db


def add_model(*args: str) -> str:
    out = StringIO()
    call_command("add_model", *args, stdout=out)
    return out.getvalue()


def test_add_model_names_a_draft_with_the_same_tokenizer(llama: Path) -> None:
    add_model("small", "--weights", str(llama))

    out = add_model("large", "--weights", str(llama), "--draft", "small")

    assert LanguageModel.objects.get(key="large").draft == LanguageModel.objects.get(key="small")
    assert out.rstrip().endswith(", draft small")


def test_add_model_sets_the_draft_of_a_model_already_added(llama: Path) -> None:
    add_model("small", "--weights", str(llama))
    add_model("large", "--weights", str(llama))

    add_model("large", "--weights", str(llama), "--draft", "small")

    assert LanguageModel.objects.get(key="large").draft_id is not None


def test_add_model_refuses_a_draft_with_another_vocabulary(
    llama: Path, other_vocabulary: Path
) -> None:
    add_model("other", "--weights", str(other_vocabulary))

    with pytest.raises(CommandError) as refused:
        add_model("large", "--weights", str(llama), "--draft", "other")

    assert str(refused.value) == (
        "model large refused: model 'other' has another tokenizer than 'large' "
        "(2 of its 259 tokens under other ids): a draft must share the model's tokenizer"
    )
    assert not LanguageModel.objects.filter(key="large").exists()


@pytest.mark.parametrize(
    ("draft", "reason"),
    [("nothing", "no model 'nothing' to draft with"), ("large", "cannot be its own draft")],
)
def test_add_model_refuses_a_draft_that_is_not_another_model(
    llama: Path, draft: str, reason: str
) -> None:
    add_model("large", "--weights", str(llama))

    with pytest.raises(CommandError, match=reason):
        add_model("large", "--weights", str(llama), "--draft", draft)


@pytest.fixture
def staff_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("operator", password="pw-for-tests"))
    return client


def admin_change(client: Client, model: LanguageModel, draft: LanguageModel | None) -> str:
    form = {
        "key": model.key,
        "display_name": model.display_name,
        "weight_source": model.weight_source,
        "prompt_price_per_1k": str(model.prompt_price_per_1k),
        "completion_price_per_1k": str(model.completion_price_per_1k),
        "draft": draft.pk if draft is not None else "",
    }
    url = f"/admin/nodes_app/languagemodel/{model.pk}/change/"
    return client.post(url, form, follow=True).content.decode()


def test_the_admin_sets_a_draft_and_refuses_one_with_another_vocabulary(
    staff_client: Client, llama: Path, other_vocabulary: Path
) -> None:
    add_model("small", "--weights", str(llama))
    add_model("other", "--weights", str(other_vocabulary))
    large = LanguageModel.objects.get(key="tiny-random-llama")

    admin_change(staff_client, large, LanguageModel.objects.get(key="small"))
    large.refresh_from_db()
    assert large.draft is not None and large.draft.key == "small"

    page = admin_change(staff_client, large, LanguageModel.objects.get(key="other"))
    large.refresh_from_db()
    assert "(2 of its 259 tokens under other ids)" in page
    assert large.draft is not None and large.draft.key == "small"

    admin_change(staff_client, large, None)
    large.refresh_from_db()
    assert large.draft is None


def test_the_registration_answer_names_the_models_draft(
    llama: Path, responder: ChallengeResponder
) -> None:
    client = APIClient()
    plain = client.post("/api/nodes/register", proven_registration(responder), format="json")
    add_model("small", "--weights", str(llama))
    LanguageModel.objects.filter(key="tiny-random-llama").update(
        draft=LanguageModel.objects.get(key="small")
    )

    drafting = client.post("/api/nodes/register", proven_registration(responder), format="json")

    assert plain.json()["draft"] is None
    assert drafting.status_code == status.HTTP_201_CREATED, drafting.content
    assert drafting.json()["draft"] == {"key": "small", "weight_source": str(llama.resolve())}
