"""``vllm serve`` on jax (NOTE [vLLM on jax] in src/torch_jax/vllm/_platform.py), driven
by the ``openai`` client on 127.0.0.1: the models, completions (several prompts, logprobs,
greedy text as transformers' on the CPU), chat with the model's template, streaming, vLLM's
own 400 for a prompt past the context and for an invalid parameter (the server serving on
after each), and a clean shutdown. One server for the file."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'torch_jax[vllm]')")
openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install 'torch_jax[vllm]')")

import _vllm_models  # noqa: E402

START_TIMEOUT = 300
PROMPTS = ["w1 w2 w3 w4", "w9 w8 w7", "w20 w30 w40 w50 w60 w70"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path, tokenizer = _vllm_models.make_model("llama", str(tmp_path_factory.mktemp("serve")))
    port = _free_port()
    log = tmp_path_factory.mktemp("serve-log") / "server.log"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", path, "--tokenizer", tokenizer,
               "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "128",
               "--max-num-seqs", "8", "--served-model-name", "tiny", "--seed", "0", "--kv-cache-memory", str(8 << 20)]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-6000:]}")
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if time.monotonic() > deadline:
                    pytest.fail(f"vllm serve did not answer in {START_TIMEOUT} s:\n{log.read_text()[-6000:]}")
                time.sleep(1)
        yield client, proc, path, tokenizer, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _hf_greedy(path, tokenizer, prompt, new):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)  # (as the server's text)


def test_models_and_completions(server):
    client, _, path, tokenizer, _ = server
    assert [m.id for m in client.models.list().data] == ["tiny"]
    got = client.completions.create(
        model="tiny", prompt=PROMPTS, max_tokens=6, temperature=0, logprobs=2, extra_body={"ignore_eos": True}
    )
    assert len(got.choices) == len(PROMPTS)
    for choice in sorted(got.choices, key=lambda c: c.index):
        want = _hf_greedy(path, tokenizer, PROMPTS[choice.index], 6)
        assert choice.text.split() == want.split()
        assert len(choice.logprobs.tokens) == 6
        assert all(
            len(top) >= 2 and lp <= 0 for top, lp in zip(choice.logprobs.top_logprobs, choice.logprobs.token_logprobs)
        )


def test_chat_and_streaming(server):
    client, *_ = server
    messages = [{"role": "user", "content": "w3 w4 w5"}]
    chat = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    text = chat.choices[0].message.content
    assert chat.choices[0].message.role == "assistant" and len(text.split()) == 5
    pieces = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=5, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
        if chunk.choices
    ]
    assert len([p for p in pieces if p]) >= 2 and "".join(pieces).split() == text.split()


def test_bad_requests_get_400_and_the_server_serves_on(server):
    client, *_ = server
    too_long = " ".join(f"w{i % 150}" for i in range(200))  # (past the 128-token context)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=too_long, max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=-1.0)
    got = client.completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=3, temperature=0, extra_body={"ignore_eos": True}
    )
    assert len(got.choices[0].text.split()) == 3


def test_clean_shutdown(server):
    _, proc, _, _, log = server
    os.kill(proc.pid, signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"vllm serve did not stop in 60 s after SIGTERM:\n{log.read_text()[-4000:]}")
    assert code == 0, log.read_text()[-4000:]
    deadline = time.monotonic() + 30  # (the engine's process ends after the server's)
    while (left := _group(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes of the server's group still running 30 s after it stopped: {left}"


def _group(pgid: int) -> list[str]:
    out = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split()[1:2] != ["Z"]]  # (zombies have exited)
