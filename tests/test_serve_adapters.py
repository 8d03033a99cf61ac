"""A real ``horizon serve`` process (tiny random model) serving LoRA adapters as vLLM's server does:
``--lora-modules`` at start, ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``, each
adapter listed by ``/v1/models`` and chosen per request by ``model``, requests of several adapters
batched together, unloading that waits for the adapter's requests and frees it, and every bad
input a one-line 4xx that changes nothing.

The tests share one server but none relies on what another left: each loads (and unloads) the
adapters it needs under names of its own; only ``alpha`` (``--lora-modules``) is there from the start.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import httpx
import openai
import pytest
import torch

from horizonrl.local_server import free_port
from horizonrl.serve.server import serve_in_subprocess

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "adapters-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_LORAS = 3
TINY = ["model.path=tiny-random", "name=calc", "model.dtype=float32", "engine.dtype=float32"]


def _save_adapter(folder: Path, seed: int, model=None) -> Path:
    """A LoRA adapter made by PEFT (of the tiny model, or ``model``), its B matrices random non-zero
    so that it changes what is sampled."""
    from peft import LoraConfig, get_peft_model

    from horizonrl.models import tiny_random_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"])
    with warnings.catch_warnings():  # peft calls a transformers API deprecated in 5.x
        warnings.simplefilter("ignore", FutureWarning)
        policy = get_peft_model(model if model is not None else tiny_random_model()[0], config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    policy.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> Path:
    """The checkpoint root: four adapters of the tiny model, one of another base (wider MLP), one
    whose weights file is cut short."""
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("loras")
    for seed, name in enumerate(("alpha", "beta", "gamma", "delta"), start=1):
        _save_adapter(root / name, seed)
    shape = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    wider = LlamaForCausalLM(LlamaConfig(**shape, num_key_value_heads=2, head_dim=16, intermediate_size=96))
    _save_adapter(root / "wider", 9, wider)
    shutil.copytree(root / "alpha", root / "truncated")
    weights = root / "truncated" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return root


@pytest.fixture(scope="module")
def server(roots):
    args = ["--lora-modules", f"alpha={roots / 'alpha'}", "--max-loras", str(MAX_LORAS)]
    with serve_in_subprocess(
        "configs/calc.yaml", TINY, token=TOKEN, extra_args=args, checkpoint_roots=[str(roots)]
    ) as (url, _proc):
        yield url


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, headers=AUTH, timeout=120) as client:
        yield client


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=TOKEN, max_retries=0, timeout=120)


def _load(http: httpx.Client, name: str, path: Path | str, **extra) -> httpx.Response:
    return http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path), **extra})


def _unload(http: httpx.Client, name: str) -> httpx.Response:
    return http.post("/v1/unload_lora_adapter", json={"lora_name": name})


def _models(http: httpx.Client) -> dict[str, dict]:
    return {card["id"]: card for card in http.get("/v1/models").json()["data"]}


def _greedy(folder: Path | None, prompt: list[int], n: int) -> list[int]:
    """What the tiny model with the adapter in ``folder`` (a PEFT model; None: the base) writes
    greedily after ``prompt``."""
    from peft import PeftModel

    from horizonrl.models import tiny_random_model

    model = tiny_random_model()[0]
    if folder is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model = PeftModel.from_pretrained(model, str(folder))
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
        )
    return out[0, len(prompt) :].tolist()


def _one_line_error(answer: httpx.Response, status: int, code: str, says: str) -> None:
    error = answer.json()["error"]
    assert answer.status_code == status and error["code"] == code, answer.text
    assert says in error["message"] and "\n" not in error["message"], error["message"]


def test_adapters_are_listed_with_their_path_and_base_model(http, client, roots):
    assert _models(http)["alpha"] == {
        **_models(http)["alpha"],
        "root": str(roots / "alpha"),
        "parent": "calc",
    }
    loaded = _load(http, "org/listed-v1.2", roots / "beta")  # any name, dots and slashes too
    assert loaded.status_code == 200, loaded.text
    assert loaded.text == "Success: LoRA adapter 'org/listed-v1.2' added successfully."
    listed = client.models.list().data
    assert listed[0].id == "calc" and {"alpha", "org/listed-v1.2"} <= {m.id for m in listed}
    card = next(m for m in listed if m.id == "org/listed-v1.2")
    assert (card.root, card.parent) == (str(roots / "beta"), "calc")
    assert http.get("/v1/models/alpha").json()["parent"] == "calc"
    assert http.get("/v1/models/org/listed-v1.2").json()["root"] == str(roots / "beta")
    assert "org/listed-v1.2" in http.get("/health").json()["lora_adapters"]
    unloaded = _unload(http, "org/listed-v1.2")
    assert unloaded.status_code == 200 and unloaded.text.endswith("removed successfully.")
    assert "org/listed-v1.2" not in _models(http)


def test_each_request_decodes_with_its_adapter_in_batches_shared_with_the_others(
    http, client, roots, tokenizer
):
    if "beta" not in _models(http):
        assert _load(http, "beta", roots / "beta").status_code == 200
    prompts = [tokenizer.encode(f"Question {i}: how many apples are there?") for i in range(3)]
    folders = {"calc": None, "alpha": roots / "alpha", "beta": roots / "beta"}
    jobs = [(model, prompt) for prompt in prompts for model in folders]
    before = http.get("/health").json()["engine"]

    def ask(job: tuple[str, list[int]]):
        model, prompt = job
        return client.completions.create(
            model=model, prompt=prompt, max_tokens=8, temperature=0, extra_body={"return_token_ids": True}
        )

    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        replies = list(pool.map(ask, jobs))
    after = http.get("/health").json()["engine"]
    for (model, prompt), reply in zip(jobs, replies, strict=True):
        assert reply.model == model  # the reply names the adapter it was sampled with
        assert reply.choices[0].token_ids == _greedy(folders[model], prompt, 8), model
    for i in range(len(prompts)):  # each adapter writes something else
        assert len({tuple(r.choices[0].token_ids) for r in replies[3 * i : 3 * i + 3]}) == 3
    rows, steps = after["decode_rows"] - before["decode_rows"], after["decode_steps"] - before["decode_steps"]
    assert rows > steps, (rows, steps)  # decode steps ran rows of several requests (and adapters) together

    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    assert client.chat.completions.create(model="beta", **chat).model == "beta"
    assert {c.model for c in client.chat.completions.create(model="alpha", stream=True, **chat)} == {"alpha"}
    session = http.post(
        "/v1/chat/completions", json={"model": "beta", **chat}, headers={"X-Session-Id": "s1"}
    )
    assert session.json()["model"] == "beta" and session.json()["horizon"]["session_id"] == "s1"


def test_unloading_waits_for_the_adapters_requests_then_frees_it(http, roots):
    assert _load(http, "draining", roots / "gamma").status_code == 200
    held = http.get("/health").json()["engine"]["lora_adapters"]
    long = {"model": "draining", "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0}
    finished: dict[str, float] = {}

    def generate() -> None:
        finished["tokens"] = http.post("/v1/completions", json=long).json()["usage"]["completion_tokens"]
        finished["at"] = time.monotonic()

    running = threading.Thread(target=generate)
    running.start()
    deadline = time.monotonic() + 60
    while http.get("/health").json()["in_flight"] < 1:
        assert time.monotonic() < deadline, "the long request never started"
        time.sleep(0.01)
    unload = _unload(http, "draining")
    unloaded_at = time.monotonic()
    running.join(timeout=120)
    assert unload.status_code == 200, unload.text
    assert finished["tokens"] == 400 and finished["at"] <= unloaded_at  # nothing was cut off
    assert "draining" not in _models(http)
    assert http.get("/health").json()["engine"]["lora_adapters"] == held - 1  # the engine let go of it
    gone = http.post("/v1/completions", json={**long, "max_tokens": 2})
    _one_line_error(gone, 404, "model_not_found", "The model `draining` does not exist")


def test_a_name_loaded_in_place_takes_the_new_weights(http, roots, tokenizer):
    prompt = tokenizer.encode("The weather today is")

    def tokens() -> list[int]:
        body = {
            "model": "inplace",
            "prompt": prompt,
            "max_tokens": 6,
            "temperature": 0,
            "return_token_ids": True,
        }
        return http.post("/v1/completions", json=body).json()["choices"][0]["token_ids"]

    assert _load(http, "inplace", roots / "gamma").status_code == 200
    assert tokens() == _greedy(roots / "gamma", prompt, 6)
    assert _load(http, "inplace", roots / "delta", load_inplace=True).status_code == 200
    assert tokens() == _greedy(roots / "delta", prompt, 6)
    assert _models(http)["inplace"]["root"] == str(roots / "delta")
    assert _unload(http, "inplace").status_code == 200


def test_bad_loads_and_unloads_are_one_line_4xx_and_change_nothing(http, roots, tmp_path):
    prompt = {"prompt": [504, 3479, 314], "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    alpha = http.post("/v1/completions", json={"model": "alpha", **prompt}).json()["choices"][0]["token_ids"]
    models, health = _models(http), http.get("/health").json()
    cases = [
        (_load(http, "w", roots / "wider"), 400, "invalid_lora_adapter", "do not fit a linear layer"),
        (_load(http, "t", roots / "truncated"), 400, "invalid_lora_adapter", "unreadable adapter_model"),
        (_load(http, "m", roots / "missing"), 404, "lora_path_not_found", "is not a directory"),
        (_load(http, "o", tmp_path), 403, "checkpoint_not_allowed", "not under the allowed checkpoint roots"),
        (_load(http, "alpha", roots / "beta"), 400, "lora_already_loaded", "'load_inplace': true"),
        (_load(http, "calc", roots / "beta"), 400, "invalid_lora_name", "is the base model's"),
        (_unload(http, "nope"), 404, "lora_not_found", "The LoRA adapter 'nope' cannot be found"),
        (http.post("/v1/load_lora_adapter", json={"lora_name": "x"}), 400, None, "lora_path"),
        (http.post("/v1/completions", json={"model": "nope", **prompt}), 404, "model_not_found", "`nope`"),
    ]
    for answer, status, code, says in cases:
        error = answer.json()["error"]
        assert answer.status_code == status and error["code"] == code, answer.text
        assert says in error["message"] and "\n" not in error["message"], error["message"]
    truncated = cases[1][0].json()["error"]["message"]
    assert truncated.startswith(f"LoRA adapter {str(roots / 'truncated')!r} cannot be served")
    fillers = [f"fill{i}" for i in range(MAX_LORAS - len(models) + 1)]
    for name in fillers:
        assert _load(http, name, roots / "gamma").status_code == 200
    _one_line_error(
        _load(http, "over", roots / "delta"), 400, "lora_limit_reached", f"(--max-loras {MAX_LORAS})"
    )
    for name in fillers:
        assert _unload(http, name).status_code == 200
    assert _models(http) == models  # nothing half-loaded: the server serves what it served
    assert http.get("/health").json()["engine"]["lora_adapters"] == health["engine"]["lora_adapters"]
    again = http.post("/v1/completions", json={"model": "alpha", **prompt}).json()["choices"][0]["token_ids"]
    assert again == alpha


async def test_loading_and_unloading_adapters_need_a_token_as_weight_swaps_do(
    tiny_model_and_tokenizer, roots
):
    import copy

    from horizonrl.engine.hf import HFEngine
    from horizonrl.serve.app import create_app
    from horizonrl.serve.server import LiveServer
    from horizonrl.serve.service import PolicyService
    from horizonrl.serve.weights import WeightSwaps

    model, tokenizer = tiny_model_and_tokenizer
    service = PolicyService(HFEngine(copy.deepcopy(model), tokenizer), tokenizer, "calc")
    app = create_app(service, weight_swaps=WeightSwaps(lambda _: lambda: None, roots=[roots]))
    async with LiveServer(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
        load = await http.post(
            "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(roots / "alpha")}
        )
        unload = await http.post("/v1/unload_lora_adapter", json={"lora_name": "a"})
    for answer, what in ((load, "LoRA adapter loads"), (unload, "LoRA adapter unloads")):
        _one_line_error(answer, 403, "weight_swaps_need_token", f"{what} need a token")
        assert "--allow-weight-swaps-without-token" in answer.json()["error"]["message"]
    assert service.loras.names == [] and service.engine.adapters == ()


def test_the_cli_refuses_bad_lora_options_in_one_line(roots):
    base = [
        sys.executable,
        "-m",
        "horizonrl.cli",
        "serve",
        "configs/calc.yaml",
        *TINY,
        "--port",
        str(free_port()),
    ]
    cases = {
        "--max-loras=0 is below the minimum of 1": ["--max-loras", "0"],
        "is not NAME=DIR": ["--lora-modules", str(roots / "alpha")],
        "is not a directory": ["--lora-modules", f"a={roots / 'missing'}"],
        "more than --max-loras 1": [
            "--max-loras",
            "1",
            *(f"--lora-modules={n}={roots / n}" for n in ("alpha", "beta")),
        ],
        "do not fit a linear layer": ["--lora-modules", f"wide={roots / 'wider'}"],  # checked on the model
    }
    running = {
        says: subprocess.Popen(
            [*base, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for says, args in cases.items()
    }
    for says, proc in running.items():
        _, err = proc.communicate(timeout=180)
        lines = err.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], (says, err[-800:])
