"""Tiny random language models for vLLM's tests on jax, made locally (nothing from a hub):
a word-level tokenizer over a small vocabulary, with a chat template, and Llama, Qwen2 and
GPT-2 configs with random weights, saved as a Hugging Face model folder."""

from __future__ import annotations

import os

import torch

WORDS = [f"w{i}" for i in range(180)]
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant {% endif %}"
)


def make_tokenizer(path: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIAL + ["user", "assistant", "system"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # (joins words with spaces)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return fast


def make_model(
    kind: str,
    path: str,
    *,
    layers: int = 2,
    width: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    max_len: int = 512,
):
    """Saves a random ``kind`` model ("llama", "qwen2", "gpt2") to ``path`` and its
    tokenizer to ``path/tokenizer``; returns the two folders. (The tokenizer has a folder
    of its own: transformers loads a model folder's tokenizer as the model type's class,
    Qwen2's byte-level BPE, which does not read this vocabulary.)"""
    import transformers

    tok = make_tokenizer(os.path.join(path, "tokenizer"))
    vocab = len(tok)
    common = dict(
        vocab_size=vocab, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    if kind in ("llama", "qwen2"):  # (the same decoder; Qwen2's shares its embeddings with its head)
        config = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[kind](
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=max_len,
            tie_word_embeddings=kind == "qwen2",
            **common,
        )
    elif kind == "gpt2":
        config = transformers.GPT2Config(n_embd=width, n_layer=layers, n_head=heads, n_positions=max_len, **common)
    else:
        raise ValueError(kind)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # (larger weights than the init's: sharper, more varied next-token choices)
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    model.save_pretrained(path)
    return path, os.path.join(path, "tokenizer")
