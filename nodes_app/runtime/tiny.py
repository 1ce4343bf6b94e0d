"""The catalogue's ``tiny-random-llama``: a 4-layer Llama built in code from a fixed seed.

Every process that builds it holds identical weights, so split-versus-whole
comparisons across node processes are exact. Its tokenizer is byte-level
(one token per UTF-8 byte, plus three ChatML specials) and built without any
download, so multi-byte characters really do span several tokens.
"""

from __future__ import annotations

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 20260101
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        initializer_range=0.1,
        tie_word_embeddings=False,
        bos_token_id=None,
        pad_token_id=256,
        eos_token_id=258,
    )


def tiny_state_dict() -> dict[str, torch.Tensor]:
    """The full model's weights, identical in every process (seeded, CPU, float32)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(tiny_config()).to(torch.float32)
    weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    # Silence the LM head for bytes that are not printable ASCII (keeping EOS), so
    # greedy output reads as text and streams in several chunks.
    keep = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
    keep[32:127] = True
    keep[10] = True
    keep[VOCAB_SIZE - 1] = True
    weights["lm_head.weight"][~keep] = 0.0
    return weights


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's printable stand-in for each byte, which the ByteLevel decoder undoes.
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {byte: chr(code) for byte, code in zip(printable, codes, strict=True)}


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
    for offset, token in enumerate(SPECIAL_TOKENS):
        vocab[token] = 256 + offset
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(token, special=True) for token in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )
