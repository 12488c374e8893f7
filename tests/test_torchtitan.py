"""TorchTitan trains on the jax device unchanged (issue 48): torchtitan 0.3.0's llama3 debug
model through its own launcher and entry point, ``torchrun -m torchtitan.train --module llama3
--config llama3_debugmodel``, made small from its command line only (64 tokens a sample, four
steps), on its test tokenizer (tests/data/torchtitan/tokenizer, from TorchTitan's repository:
BSD-3-Clause, its LICENSE beside it) and a dataset written here.

The runs, each under ``TORCH_JAX_FALLBACK=error`` (no op on the CPU fallback, every graph of
``torch.compile`` one XLA computation):

- one process, a DCP checkpoint every two steps: the loss falls, and its step-3 loss is what
  TorchTitan's own model computes on the CPU from the step-2 checkpoint for the step-3 batch
  (forward only: the CPU's eager FlexAttention computes no gradients);
- the same run resumed from its step-2 checkpoint: steps 3 and 4 as uninterrupted;
- FSDP2 over two processes, tensor parallelism over two, and ``--compile.enable``, each started
  from the step-2 checkpoint (model, optimizer, schedule and step: DCP reshards it for the two
  processes): steps 3 and 4's loss and gradient norm within 1e-3 of the one process's.

The parallel runs start from a checkpoint because a sharded model's random initialization
differs from the unsharded one (DTensor's RNG draws per shard): TorchTitan's way to compare
parallelisms is a seed checkpoint, and the step-2 checkpoint is one that costs no launch.

These tests run where torchtitan is installed: CI's torch 2.14 venv (.ci/run). Each run is a
torchrun launch of its own, so the module's runs are shared by its tests (run the file without
pytest-xdist's ``-n``, or each worker makes its own runs); the four that start from the one
process's checkpoint run two at a time.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("torchtitan") is None,
        reason="torchtitan is not installed (CI installs torchtitan==0.3.0 in its torch 2.14 venv: .ci/run)",
    ),
    pytest.mark.skipif(
        not hasattr(torch.distributed, "set_timeout"),
        reason=f"torchtitan 0.3.0 needs torch 2.14 (torch.distributed.set_timeout); this is torch {torch.__version__}",
    ),
]

TOKENIZER = Path(__file__).resolve().parent / "data" / "torchtitan" / "tokenizer"
SEQ_LEN = 64
BATCH = 4  # the global batch: one process's, or two FSDP2 ranks' of 2 each
STEPS = 4
RESUME = 2  # the checkpoint the other runs start from
TIMEOUT = 420  # seconds a launch (two processes on CI's two cores take about a minute)

# the arguments of every run: the debug model on CPU-sized work
COMMON = [
    "--module", "llama3", "--config", "llama3_debugmodel",
    "--hf-assets-path", str(TOKENIZER),
    "--dataloader.dataset", "c4_test",  # (TorchTitan's local JSON dataset, read from --dataloader.dataset-path)
    "--training.seq-len", str(SEQ_LEN),
    "--training.steps", str(STEPS),
    # (float32 parameters in the forward, not the debug config's bfloat16: the CPU's float32
    # forward is then the oracle, and the parallel runs' differences are not bfloat16's rounding)
    "--training.mixed-precision-param", "float32",
    "--debug.seed", "0",
    "--metrics.log-freq", "1",
    "--metrics.disable-color-printing",
]  # fmt: skip

_STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)\s+grad_norm:\s*([0-9.]+)")
_MESH = re.compile(r"Building device mesh with parallelism: (.*)")


def _documents(n: int) -> list[str]:
    """``n`` texts of exactly ``SEQ_LEN + 1`` tokens with TorchTitan's BOS and EOS (its
    tokenizer, as its dataset calls it), so that each is one sample: a batch is then a set of
    whole documents, whichever rank reads it."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(TOKENIZER))
    words = "the a cat dog sat on mat ran to house big small red blue green tree under over and with of in".split()
    rng = random.Random(0)

    def length(ws):
        return len(tokenizer.encode(" ".join(ws), add_bos=True, add_eos=True))

    docs = []
    for _ in range(n):
        ws = []
        while length(ws) < SEQ_LEN + 1:
            ws.append(rng.choice(words))
        while length(ws) > SEQ_LEN + 1:
            ws.pop()
        while length(ws) < SEQ_LEN + 1:
            ws.append("a")
        assert length(ws) == SEQ_LEN + 1, ws
        docs.append(" ".join(ws))
    return docs


def _write(folder: Path, docs: list[str]) -> Path:
    folder.mkdir(parents=True)
    (folder / "data.json").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return folder


class _Titan:
    """The module's launches, each made once, when a test first needs it."""

    def __init__(self, root: Path):
        self.root = root
        self.docs = _documents(BATCH * (STEPS + 2))  # (two batches more than the runs read)
        self.data = _write(root / "data" / "one", self.docs)
        # TorchTitan gives rank r of 2 the r-th contiguous half of a dataset (datasets'
        # split_dataset_by_node); the halves here alternate 2-document blocks of what the one
        # process reads after step RESUME, so that both ranks' step-s batches together are
        # the one process's step-s batch
        rest = self.docs[BATCH * RESUME :]
        halves = [[d for i, d in enumerate(rest) if (i // (BATCH // 2)) % 2 == r] for r in range(2)]
        self.data_two_ranks = _write(root / "data" / "two_ranks", halves[0] + halves[1])
        self.env = self._env()
        self.outputs = {}
        self.pending = None  # the launches after "one", in flight (``_start_the_rest``)

    def _env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # (each process its own device)
        env.update(
            TORCH_JAX_FALLBACK="error",
            HF_HUB_OFFLINE="1",  # (the dataset and tokenizer are local: nothing from the hub)
            HF_DATASETS_OFFLINE="1",
            HF_HOME=str(self.root / "hf"),
            TOKENIZERS_PARALLELISM="false",
        )
        if env.get("TORCH_JAX_COMPILATION_CACHE", "0") == "0":
            # (the launches compile the same computations: one persistent cache for the
            # module's, in its own folder, never the user's; CI's run has one of its own)
            env.update(
                TORCH_JAX_COMPILATION_CACHE="1",
                TORCH_JAX_CACHE_DIR=str(self.root / "cache"),
                JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            )
        return env

    def checkpoint(self) -> Path:
        self.run("one")
        return self.root / "one" / "checkpoint" / f"step-{RESUME}"

    def run(self, name: str) -> str:
        """Rank 0's output of the launch ``name`` (a failed launch fails each test that needs it,
        without launching again)."""
        if name not in self.outputs:
            if name != "one":
                self._start_the_rest()
            launched = (self.pending or {}).get(name)
            self.outputs[name] = launched.result() if launched else self._launch(name)
        ok, text = self.outputs[name]
        if not ok:
            pytest.fail(text, pytrace=False)
        return text

    def _start_the_rest(self) -> None:
        """The launches that start from the one process's checkpoint, independent of each
        other, two at a time once it is there: the two one-process runs side by side, then
        the two two-process ones, so that both of CI's cores work (one after another they took
        207 s of CI's run on a 2-core EPYC, 2026-12-07, the one-process runs leaving a core idle)."""
        if self.pending is None:
            self.checkpoint()
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
            self.pending = {name: pool.submit(self._launch, name) for name in ("resumed", "compiled", "fsdp", "tp")}
            pool.shutdown(wait=False)

    def _started_from_the_checkpoint(self) -> list[str]:
        """A run's arguments to start from all of the one process's step-2 checkpoint and
        save none."""
        return [
            "--checkpoint.enable",
            "--checkpoint.load-only",
            "--checkpoint.initial-load-path", str(self.checkpoint()),
            "--checkpoint.no-initial-load-model-only",
        ]  # fmt: skip

    def _launch(self, name: str) -> tuple[bool, str]:
        nproc, dump, args = 1, self.root / name, []
        if name == "one":
            args = ["--dataloader.dataset-path", str(self.data), "--training.local-batch-size", str(BATCH)]
            args += ["--checkpoint.enable", "--checkpoint.interval", str(RESUME)]
        elif name == "resumed":
            # (TorchTitan's own resumption: the same dump folder, whose checkpoint folder is
            # not empty, at the step asked for)
            dump = self.root / "one"
            args = ["--dataloader.dataset-path", str(self.data), "--training.local-batch-size", str(BATCH)]
            args += ["--checkpoint.enable", "--checkpoint.load-only", "--checkpoint.load-step", str(RESUME)]
        elif name == "fsdp":
            nproc = 2
            args = ["--dataloader.dataset-path", str(self.data_two_ranks)]
            args += ["--training.local-batch-size", str(BATCH // 2), "--parallelism.data-parallel-shard-degree", "2"]
            # (the one process's dataloader state is its read position in another file)
            args += self._started_from_the_checkpoint() + ["--checkpoint.exclude-from-loading", "dataloader"]
        elif name == "tp":
            nproc = 2
            args = ["--dataloader.dataset-path", str(self.data), "--training.local-batch-size", str(BATCH)]
            args += ["--parallelism.tensor-parallel-degree", "2", *self._started_from_the_checkpoint()]
        elif name == "compiled":
            args = ["--dataloader.dataset-path", str(self.data), "--training.local-batch-size", str(BATCH)]
            args += ["--compile.enable", *self._started_from_the_checkpoint()]
        else:
            raise ValueError(name)
        _skip_without_devices(nproc)
        dump.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        # (rank 0's output: TorchTitan logs the step's metrics there; a failing rank's
        # traceback comes in torchrun's summary)
        cmd += ["--local-ranks-filter=0", "--tee=3", "-m", "torchtitan.train", *COMMON]
        cmd += ["--dump-folder", str(dump), *args]
        try:
            out = subprocess.run(cmd, cwd=dump, env=self.env, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired as e:
            text = "".join(
                x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr)
            )
            return False, f"torchtitan run {name!r} took over {TIMEOUT} s:\n{text[-6000:]}"
        text = out.stdout + out.stderr
        if out.returncode != 0:
            return False, f"torchtitan run {name!r} failed:\n{text[-8000:]}"
        if "JAX memory usage for model" not in text:  # (TorchTitan's device is jax)
            return False, f"torchtitan run {name!r} did not run on jax:\n{text[-4000:]}"
        return True, text


def _skip_without_devices(nproc: int) -> None:
    """On the CPU each process gets a device of its own; on a GPU each needs one."""
    import jax

    if jax.default_backend() != "cpu" and jax.local_device_count() < nproc:
        pytest.skip(
            f"{nproc} processes need {nproc} {jax.default_backend()} devices; JAX sees {jax.local_device_count()}"
        )


def _steps(text: str) -> dict[int, tuple[float, float]]:
    """step -> (loss, gradient norm), as TorchTitan logs them (5 and 4 decimals)."""
    return {int(s): (float(loss), float(norm)) for s, loss, norm in _STEP.findall(text)}


def _mesh(text: str) -> str:
    found = _MESH.findall(text)
    assert found, text[-4000:]
    return found[-1]


def _assert_steps_match(run: dict, reference: dict, what: str) -> None:
    assert sorted(run) == list(range(RESUME + 1, STEPS + 1)), (what, run)
    for step, (loss, norm) in run.items():
        ref_loss, ref_norm = reference[step]
        assert abs(loss - ref_loss) <= 1e-3, f"{what}: step {step} loss {loss} against {ref_loss}"
        assert abs(norm - ref_norm) <= 1e-3 * ref_norm, f"{what}: step {step} gradient norm {norm} against {ref_norm}"


@pytest.fixture(scope="module")
def titan(tmp_path_factory):
    return _Titan(tmp_path_factory.mktemp("torchtitan"))


# (DCP loads in a process without a process group, as meant; the CPU's eager FlexAttention
# computes the full scores, as meant for 64 tokens)
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
def test_one_process_trains_and_its_loss_is_torchtitans_model_on_the_cpu(titan, monkeypatch):
    one = _steps(titan.run("one"))
    assert sorted(one) == list(range(1, STEPS + 1)), one
    assert one[STEPS][0] < one[1][0] - 1.0, one  # (8.0 -> 5.6 here)
    assert "dp_shard=1, cp=1, tp=1" in _mesh(titan.run("one"))

    # TorchTitan's model on the CPU, from the step-2 checkpoint, on the step-3 batch
    import torch.distributed.checkpoint as dcp
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.models.common import attention
    from torchtitan.models.llama3 import model_registry

    # (TorchTitan compiles both with Inductor, which on the CPU builds C++ for minutes;
    # their eager forms compute the same)
    monkeypatch.setattr(attention, "_compiled_create_block_mask", create_block_mask)
    monkeypatch.setattr(attention.FlexAttention, "_compiled_flex_attn", staticmethod(flex_attention))
    with torch.device("meta"):
        model = model_registry("debugmodel").model.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))  # (RoPE's cache, not in checkpoints)
    state = model.state_dict()
    dcp.load(state, checkpoint_id=str(titan.checkpoint()))
    model.load_state_dict(state)
    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(TOKENIZER))
    batch = titan.docs[BATCH * RESUME : BATCH * (RESUME + 1)]
    tokens = torch.tensor([tokenizer.encode(d, add_bos=True, add_eos=True) for d in batch])  # (B, T + 1)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    positions = torch.arange(SEQ_LEN).expand(len(batch), SEQ_LEN)
    with torch.no_grad():
        masks = model.get_attention_masks(positions=positions)
        logits = model(inputs, positions=positions, attention_masks=masks)  # (B, T, vocab)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()).item()
    assert abs(one[RESUME + 1][0] - loss) <= 1e-4, (one[RESUME + 1], loss)


def test_resumed_from_the_dcp_checkpoint_gives_the_uninterrupted_losses(titan):
    one = _steps(titan.run("one"))
    text = titan.run("resumed")
    assert f"Loading the checkpoint from {titan.checkpoint()}" in text, text[-4000:]
    resumed = _steps(text)
    assert sorted(resumed) == list(range(RESUME + 1, STEPS + 1)), resumed
    for step, (loss, norm) in resumed.items():  # (to the digits TorchTitan logs)
        assert abs(loss - one[step][0]) <= 1e-5 and abs(norm - one[step][1]) <= 1e-4, (step, resumed, one)


def test_fsdp2_over_two_processes_matches_one_process(titan):
    text = titan.run("fsdp")
    assert "dp_shard=2, cp=1, tp=1" in _mesh(text)
    _assert_steps_match(_steps(text), _steps(titan.run("one")), "FSDP2")


def test_tensor_parallel_over_two_processes_matches_one_process(titan):
    text = titan.run("tp")
    assert "dp_shard=1, cp=1, tp=2" in _mesh(text)
    _assert_steps_match(_steps(text), _steps(titan.run("one")), "tensor parallel")


def test_compiled_run_matches_one_process(titan):
    text = titan.run("compiled")
    assert "Compiling each TransformerBlock with torch.compile" in text, text[-4000:]
    _assert_steps_match(_steps(text), _steps(titan.run("one")), "--compile.enable")
