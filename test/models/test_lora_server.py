"""LoRA over HTTP on a real server: `lora_path` on /generate, OpenAI `model` naming an adapter,
/v1/models listing adapters, /load_lora_adapter and /unload_lora_adapter while serving (SGLang's
bodies), and 400s naming the reason (unknown adapter, DoRA). Greedy outputs equal peft's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from model_harness import build_hf_model, random_ids, save_hf_model, tiny_config
from server.server_process import running_server, server_flags
from test_lora import hf_greedy, make_adapter

from radixgen.runtime.model_loader.resolve import resolve_model_path

pytestmark = pytest.mark.slow  # starts a server (real processes)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
N = 6


def test_http_lora_routes(tmp_path: Path) -> None:
    # the borrowed tokenizer's vocabulary: the server's warm-up sends it real text
    base = build_hf_model(tiny_config("llama_gqa", vocab_size=49152), seed=3)
    folder = save_hf_model(base, tmp_path / "base")
    default = Path(resolve_model_path(None))
    for name in _TOKENIZER_FILES:
        if (default / name).exists():
            shutil.copy(default / name, folder / name)
    peft_a, path_a = make_adapter(base, tmp_path / "a", seed=0, rank=4)
    peft_b, path_b = make_adapter(base, tmp_path / "b", seed=1, rank=8)
    dora = tmp_path / "dora"
    shutil.copytree(path_b, dora)
    raw = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**raw, "use_dora": True}))
    prompt = random_ids(14, seed=5)
    params = {"temperature": 0, "max_new_tokens": N, "ignore_eos": True}
    flags = ["--model-path", str(folder), "--dtype", "float32", "--max-total-tokens", "4096"]
    flags += ["--lora-paths", f"a={path_a}", "--max-lora-rank", "16", "--served-model-name", "tiny"]
    flags += server_flags()
    with running_server(*flags) as proc, httpx.Client(base_url=proc.url, timeout=120) as http:

        def generate(lora: str | None) -> httpx.Response:
            body = {"input_ids": prompt, "sampling_params": params, "lora_path": lora}
            return http.post("/generate", json=body)

        got = generate("a")
        assert got.status_code == 200, got.text
        assert got.json()["output_ids"] == hf_greedy(peft_a, prompt, N)[0]
        assert generate(None).json()["output_ids"] == hf_greedy(base, prompt, N)[0]
        bad = generate("zz")
        assert bad.status_code == 400 and "LoRA adapter 'zz' is not loaded" in bad.text

        ids = [m["id"] for m in http.get("/v1/models").json()["data"]]
        assert ids == ["tiny", "a"]
        want_text = got.json()["text"]
        for model in ("a", "tiny:a"):
            comp = http.post(
                "/v1/completions",
                json={"model": model, "prompt": prompt, "max_tokens": N, "temperature": 0,
                      "ignore_eos": True},
            )  # fmt: skip
            assert comp.status_code == 200, comp.text
            assert comp.json()["choices"][0]["text"] == want_text
        unknown = http.post(
            "/v1/completions", json={"model": "tiny:zz", "prompt": prompt, "max_tokens": 2}
        )
        assert unknown.status_code == 400 and "'zz'" in unknown.text

        refused = http.post("/load_lora_adapter", json={"lora_name": "d", "lora_path": str(dora)})
        assert refused.status_code == 400 and "DoRA" in refused.text
        loaded = http.post("/load_lora_adapter", json={"lora_name": "b", "lora_path": str(path_b)})
        assert loaded.status_code == 200, loaded.text
        assert set(loaded.json()["loaded_adapters"]) == {"a", "b"}
        assert generate("b").json()["output_ids"] == hf_greedy(peft_b, prompt, N)[0]
        gone = http.post("/unload_lora_adapter", json={"lora_name": "b"})
        assert gone.status_code == 200, gone.text
        assert generate("b").status_code == 400
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["tiny", "a"]
