"""Hugging Face transformers models (built from small configs with random weights;
nothing is downloaded) on jax against the same models on the CPU, with the CPU
fallback an error: forward outputs, one step's gradients, 30 AdamW steps, greedy
generation, from_pretrained(device_map="jax") and the Trainer."""

from __future__ import annotations

import copy
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB = 96


def _gpt2():
    return transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=VOCAB,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    )


def _llama():
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            max_position_embeddings=64,
        )
    )


def _bert():
    return transformers.BertForMaskedLM(
        transformers.BertConfig(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            vocab_size=VOCAB,
            max_position_embeddings=64,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
    )


def _t5():
    return transformers.T5ForConditionalGeneration(
        transformers.T5Config(
            num_layers=2,
            d_model=64,
            d_ff=128,
            num_heads=4,
            d_kv=16,
            vocab_size=VOCAB,
            decoder_start_token_id=0,
            dropout_rate=0.0,
        )
    )


def _vit():
    return transformers.ViTForImageClassification(
        transformers.ViTConfig(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            image_size=32,
            patch_size=8,
            num_labels=5,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
    )


def _resnet():
    return transformers.ResNetForImageClassification(
        transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=5)
    )


def _convnext():  # (depthwise 7x7 convolutions: NOTE [Grouped convolutions on XLA:CPU])
    return transformers.ConvNextForImageClassification(
        transformers.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=5, image_size=32)
    )


def _mamba():  # (a depthwise 1-d convolution a layer)
    return transformers.MambaForCausalLM(
        transformers.MambaConfig(num_hidden_layers=2, hidden_size=32, state_size=8, vocab_size=VOCAB)
    )


def _falcon():  # (multi-query attention: keys and values expanded over the heads, a boolean mask)
    return transformers.FalconForCausalLM(
        transformers.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB)
    )


def _wav2vec2():  # (its positional convolution: an even kernel padded by half, 4 groups)
    return transformers.Wav2Vec2ForSequenceClassification(
        transformers.Wav2Vec2Config(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            conv_dim=(16, 16),
            conv_stride=(5, 2),
            conv_kernel=(10, 3),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
            num_labels=5,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
            feat_proj_dropout=0.0,
            final_dropout=0.0,
            layerdrop=0.0,
            mask_time_prob=0.0,
        )
    )


MODELS = {
    "gpt2": _gpt2,
    "llama": _llama,
    "bert": _bert,
    "t5": _t5,
    "vit": _vit,
    "resnet": _resnet,
    "convnext": _convnext,
    "mamba": _mamba,
    "falcon": _falcon,
    "wav2vec2": _wav2vec2,
}


def _batch(name, device):
    g = torch.Generator().manual_seed(0)
    if name in ("gpt2", "llama", "bert", "mamba", "falcon"):
        ids = torch.randint(0, VOCAB, (2, 16), generator=g)
        batch = {"input_ids": ids, "labels": ids}
    elif name == "t5":
        batch = {
            "input_ids": torch.randint(0, VOCAB, (2, 12), generator=g),
            "labels": torch.randint(0, VOCAB, (2, 8), generator=g),
        }
    elif name == "wav2vec2":
        batch = {
            "input_values": torch.randn(2, 1600, generator=g),
            "labels": torch.randint(0, 5, (2,), generator=g),
        }
    else:
        batch = {
            "pixel_values": torch.randn(2, 3, 32, 32, generator=g),
            "labels": torch.randint(0, 5, (2,), generator=g),
        }
    return {k: v.to(device) for k, v in batch.items()}


def _pair(name):
    torch.manual_seed(0)
    cpu = MODELS[name]()
    return cpu, copy.deepcopy(cpu).to("jax")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_and_gradients_match_cpu(name):
    cpu, dev = _pair(name)
    cpu.eval(), dev.eval()  # (batch norm statistics in ResNet)
    with torch.no_grad():
        logits = cpu(**_batch(name, "cpu")).logits
        logits_dev = dev(**_batch(name, "jax")).logits
    torch.testing.assert_close(logits_dev.cpu(), logits, rtol=1e-4, atol=1e-4)

    cpu.train(), dev.train()
    cpu(**_batch(name, "cpu")).loss.backward()
    dev(**_batch(name, "jax")).loss.backward()
    for (pname, p), q in zip(cpu.named_parameters(), dev.parameters()):
        assert (p.grad is None) == (q.grad is None), pname
        if p.grad is not None:
            torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-3, atol=1e-5, msg=pname)


def _adamw_losses(model, batch, steps):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", sorted(MODELS))
def test_thirty_adamw_steps_lower_the_loss_as_on_cpu(name):
    cpu, dev = _pair(name)
    expected = _adamw_losses(cpu, _batch(name, "cpu"), 30)
    got = _adamw_losses(dev, _batch(name, "jax"), 30)
    assert got[-1] < 0.9 * got[0]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_generate_is_identical_to_cpu(name):
    cpu, dev = _pair(name)
    cpu.eval(), dev.eval()
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    expected = cpu.generate(prompt, **kw)
    got = dev.generate(prompt.to("jax"), **kw)
    assert got.device.type == "jax"
    assert torch.equal(got.cpu(), expected)


def _more_architectures():
    """Builders of more architectures (one of each family of ops: relative and ALiBi
    attention, windowed and pooled attention, depthwise and grouped convolutions, fold
    and unfold, encoder-decoders, audio and time series) and their batch kinds."""
    t = transformers
    lm = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB)
    vision = dict(image_size=32, num_labels=5)
    enc_dec = dict(
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        vocab_size=VOCAB,
    )
    return {
        "mistral": (lambda: t.MistralForCausalLM(t.MistralConfig(**lm, num_key_value_heads=2)), "text"),
        "bloom": (
            lambda: t.BloomForCausalLM(t.BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=VOCAB)),
            "text",
        ),
        "xlnet": (
            lambda: t.XLNetLMHeadModel(t.XLNetConfig(d_model=32, n_layer=2, n_head=4, d_inner=64, vocab_size=VOCAB)),
            "text",
        ),
        "deberta_v2": (lambda: t.DebertaV2ForSequenceClassification(t.DebertaV2Config(**lm, num_labels=3)), "class"),
        "funnel": (
            lambda: t.FunnelForSequenceClassification(
                t.FunnelConfig(
                    d_model=32, n_head=4, d_head=8, d_inner=64, block_sizes=[1, 1], vocab_size=VOCAB, num_labels=3
                )
            ),
            "class",
        ),
        "canine": (
            lambda: t.CanineForSequenceClassification(
                t.CanineConfig(
                    hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, num_labels=3
                )
            ),
            "class",
        ),
        "bart": (
            lambda: t.BartForConditionalGeneration(t.BartConfig(**enc_dec, max_position_embeddings=64)),
            "seq2seq",
        ),
        "swin": (
            lambda: t.SwinForImageClassification(
                t.SwinConfig(**vision, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)
            ),
            "image",
        ),
        "levit": (
            lambda: t.LevitForImageClassification(
                t.LevitConfig(
                    **vision,
                    hidden_sizes=[32, 48, 64],
                    num_attention_heads=[1, 2, 2],
                    depths=[1, 1, 1],
                    key_dim=[8, 8, 8],
                )
            ),
            "image",
        ),
        "segformer": (
            lambda: t.SegformerForImageClassification(
                t.SegformerConfig(
                    **vision,
                    num_encoder_blocks=2,
                    depths=[1, 1],
                    sr_ratios=[2, 1],
                    hidden_sizes=[16, 32],
                    num_attention_heads=[1, 2],
                )
            ),
            "image",
        ),
        "mobilenet_v2": (
            lambda: t.MobileNetV2ForImageClassification(t.MobileNetV2Config(**vision, depth_multiplier=0.25)),
            "image",
        ),
        "regnet": (
            lambda: t.RegNetForImageClassification(
                t.RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8, num_labels=5)
            ),
            "image",
        ),
        "mobilevit": (
            lambda: t.MobileViTForImageClassification(
                t.MobileViTConfig(**vision, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64])
            ),
            "image",
        ),
        "whisper": (
            lambda: t.WhisperForConditionalGeneration(
                t.WhisperConfig(
                    **enc_dec,
                    num_mel_bins=16,
                    max_source_positions=32,
                    max_target_positions=32,
                    decoder_start_token_id=1,
                    pad_token_id=0,
                )
            ),
            "speech",
        ),
        "patchtst": (
            lambda: t.PatchTSTForPrediction(
                t.PatchTSTConfig(
                    num_input_channels=3,
                    context_length=32,
                    prediction_length=8,
                    patch_length=8,
                    patch_stride=8,
                    d_model=16,
                    num_attention_heads=2,
                    num_hidden_layers=1,
                    ffn_dim=32,
                )
            ),
            "series",
        ),
    }


def _more_batch(kind):
    g = torch.Generator().manual_seed(0)
    if kind == "text":
        ids = torch.randint(0, VOCAB, (2, 12), generator=g)
        return {"input_ids": ids, "labels": ids}
    if kind == "class":
        return {
            "input_ids": torch.randint(0, VOCAB, (2, 12), generator=g),
            "labels": torch.randint(0, 3, (2,), generator=g),
        }
    if kind == "seq2seq":
        return {
            "input_ids": torch.randint(0, VOCAB, (2, 10), generator=g),
            "labels": torch.randint(0, VOCAB, (2, 6), generator=g),
        }
    if kind == "image":
        return {
            "pixel_values": torch.randn(2, 3, 32, 32, generator=g),
            "labels": torch.randint(0, 5, (2,), generator=g),
        }
    if kind == "speech":
        return {
            "input_features": torch.randn(2, 16, 64, generator=g),
            "labels": torch.randint(0, VOCAB, (2, 6), generator=g),
        }
    return {"past_values": torch.randn(2, 32, 3, generator=g), "future_values": torch.randn(2, 8, 3, generator=g)}


MORE = _more_architectures()


@pytest.mark.parametrize("name", sorted(MORE))
def test_more_architectures_loss_and_gradients_match_cpu(name):
    """In eval mode (no dropout, batch norm's running statistics): the loss and every
    parameter's gradient, with the CPU fallback an error."""
    make, kind = MORE[name]
    torch.manual_seed(0)
    cpu = make().eval()
    dev = copy.deepcopy(cpu).to("jax")
    batch = _more_batch(kind)
    loss = cpu(**batch).loss
    loss.backward()
    loss_dev = dev(**{k: v.to("jax") for k, v in batch.items()}).loss
    loss_dev.backward()
    torch.testing.assert_close(loss_dev.cpu(), loss.detach(), rtol=1e-4, atol=1e-4)
    for (pname, p), q in zip(cpu.named_parameters(), dev.parameters()):
        assert (p.grad is None) == (q.grad is None), pname
        if p.grad is not None:
            torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-3, atol=1e-5, msg=pname)


def test_from_pretrained_with_device_map_jax(tmp_path):
    cpu, _ = _pair("gpt2")
    cpu.save_pretrained(tmp_path)
    dev = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, device_map="jax")
    assert all(p.device.type == "jax" for p in dev.parameters())
    assert dev.lm_head.weight is dev.transformer.wte.weight  # still tied
    batch = _batch("gpt2", "cpu")
    with torch.no_grad():
        torch.testing.assert_close(
            dev(**{k: v.to("jax") for k, v in batch.items()}).logits.cpu(), cpu(**batch).logits, rtol=1e-4, atol=1e-4
        )


def _save_with_tokenizer(model, path):
    """``model`` and a word-level tokenizer of its VOCAB ids ("t0" ... "t95"), made here (a
    pipeline loads both from the folder; nothing is downloaded)."""
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0").save_pretrained(path)
    model.save_pretrained(path)


def test_device_map_auto_and_pipeline_load_on_jax_and_generate_the_cpus_tokens(tmp_path):
    # NOTE [Hub kernels on jax] in device/_patches: transformers 5.25 kernelizes with the map
    # accelerate planned ({"": 0}: the accelerator's index), and again at train()/eval()
    torch.manual_seed(0)
    cpu = MODELS["gpt2"]().eval()
    _save_with_tokenizer(cpu, tmp_path)
    text = "t5 t17 t3 t40 t9"
    # (one prompt of 5 tokens with its mask, as the pipeline generates: the same computations)
    prompt = dict(input_ids=torch.tensor([[5, 17, 3, 40, 9]]), attention_mask=torch.ones(1, 5, dtype=torch.int64))
    greedy = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    expected = cpu.generate(**prompt, **greedy)
    on_jax = {k: v.to("jax") for k, v in prompt.items()}

    dev = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map="auto")
    assert {p.device for p in dev.parameters()} == {torch.device("jax", 0)}
    assert dev.lm_head.weight is dev.transformer.wte.weight  # still tied
    assert torch.equal(dev.generate(**on_jax, **greedy).cpu(), expected)
    dev.train()
    dev.eval()
    assert torch.equal(dev.generate(**on_jax, **greedy).cpu(), expected)

    # NOTE [Pipelines on jax] in device/_patches: the pipeline runs where the map put the model
    pipe = transformers.pipeline("text-generation", model=str(tmp_path), device_map="auto")
    assert pipe.device == pipe.model.device == torch.device("jax", 0)
    on_cpu = transformers.pipeline("text-generation", model=str(tmp_path), device="cpu")
    assert pipe(text, **greedy) == on_cpu(text, **greedy)

    # NOTE [Device-map memory on XLA:CPU] in device/_patches: the budget is each jax device's
    # free memory, and the host's as "cpu" only where the device's memory is not the host's;
    # a max_memory too small for the model offloads the rest to the CPU, whence accelerate's
    # hooks bring each layer to jax:0 when it runs (the model: 0.44 MB, a block 0.2 MB)
    from accelerate.utils import get_max_memory

    on_host = torch.jax.get_device_properties(0).platform == "cpu"
    assert sorted(get_max_memory(), key=str) == list(range(torch.jax.device_count())) + ([] if on_host else ["cpu"])
    budget = {0: 300_000, "cpu": 10**9}
    pipe = transformers.pipeline(
        "text-generation", model=str(tmp_path), device_map="auto", model_kwargs={"max_memory": budget}
    )
    assert set(pipe.model.hf_device_map.values()) == {0, "cpu"}
    assert pipe.device == torch.device("jax", 0)
    assert pipe(text, **greedy) == on_cpu(text, **greedy)
    pipe.model.train()  # (kernelizes with the device the map runs on, jax:0, not the offloaded layers' "meta")
    pipe.model.eval()
    assert pipe(text, **greedy) == on_cpu(text, **greedy)
    # (an index is the accelerator's device, as on CUDA)
    by_index = transformers.pipeline("text-generation", model=str(tmp_path), device=0)
    assert by_index.device == by_index.model.device == torch.device("jax", 0)
    # (and given no device, the accelerator's first, as on CUDA; a model on jax:1 stays there)
    default = transformers.pipeline("text-generation", model=str(tmp_path))
    assert default.device == default.model.device == torch.device("jax", 0)
    if torch.jax.device_count() > 1:
        stays = transformers.pipeline("text-generation", model=default.model.to("jax:1"), tokenizer=default.tokenizer)
        assert stays.device == stays.model.device == torch.device("jax", 1)


# An unchanged Trainer script, as a user writes it for any accelerator: nothing names a
# device. Run in a fresh process (with ACCELERATE_TORCH_DEVICE unset), as a user runs it.
_TRAINER_SCRIPT = """
import json, sys, torch, transformers
transformers.logging.set_verbosity_error()

class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        ids = torch.randint(0, 96, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}

torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=96, n_positions=64,
                                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = transformers.GPT2LMHeadModel(config)
args = transformers.TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=4, max_steps=4,
                                      logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True,
                                      seed=0, use_cpu=sys.argv[2] == "use_cpu")
trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens())
trainer.train()
losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
print(json.dumps({"args": str(args.device), "model": str(next(model.parameters()).device), "losses": losses}))
"""


def _run_trainer_script(tmp_path, mode):
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("ACCELERATE_TORCH_DEVICE", "ACCELERATE_USE_CPU")}
    out = subprocess.run(
        [sys.executable, "-c", _TRAINER_SCRIPT, str(tmp_path / mode), mode], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_unchanged_trainer_script_trains_on_jax(tmp_path):
    # NOTE [The Trainer's device] in device/_patches: jax is the accelerator, so an
    # unchanged script trains on it, as on CUDA; with use_cpu=True on the CPU
    on_jax = _run_trainer_script(tmp_path, "default")
    on_cpu = _run_trainer_script(tmp_path, "use_cpu")
    assert (on_jax["args"], on_jax["model"]) == ("jax:0", "jax:0")
    assert (on_cpu["args"], on_cpu["model"]) == ("cpu", "cpu")
    assert len(on_jax["losses"]) == 4
    torch.testing.assert_close(torch.tensor(on_jax["losses"]), torch.tensor(on_cpu["losses"]), rtol=1e-3, atol=1e-4)


_KERNELIZE_ON_JAX = """
import sys, torch
if sys.argv[1] == "transformers first":
    import transformers.modeling_utils
torch.ones(1, device="jax")  # (registers the device, and its patches)
import transformers
config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
model = transformers.GPT2LMHeadModel(config).to("jax")
model.set_use_kernels(True)
model.train(); model.eval(); model.train()  # (each change of mode kernelizes again)
ids = torch.randint(0, 64, (1, 8), device="jax")
model(ids, labels=ids).loss.backward()
print(model.use_kernels, model.transformer.h[0].mlp.act.forward.__func__ is type(model.transformer.h[0].mlp.act).forward)
"""


@pytest.mark.parametrize("order", ["transformers first", "device first"])
def test_hub_kernels_on_jax_keep_pytorch_forwards(order):
    # NOTE [Hub kernels on jax] in device/_patches
    import subprocess
    import sys

    pytest.importorskip("kernels", reason="transformers kernelizes models only with the kernels package")
    out = subprocess.run(
        [sys.executable, "-c", _KERNELIZE_ON_JAX, order], capture_output=True, text=True, env=os.environ.copy()
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]
