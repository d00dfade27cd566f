"""`rg.Runtime`: SGLang's launcher class starts a real local server with SGLang-named keyword
arguments, serves programs, and `shutdown()` leaves no process behind."""

from __future__ import annotations

import asyncio
import json

import psutil
import pytest
import requests
from server.server_process import free_port, wait_gone

import radixgen as rg
from radixgen.errors import InvalidRequestError
from radixgen.lang.local_runtime import kwargs_to_argv


def test_server_arguments_become_launch_flags_checked_before_starting():
    argv = kwargs_to_argv(
        {"model_path": None, "mem_fraction_static": 0.5, "disable_radix_cache": True,
         "enable_cache_report": False, "chunked_prefill_size": 256}
    )  # fmt: skip
    assert argv == ["--mem-fraction-static", "0.5", "--disable-radix-cache",
                    "--no-enable-cache-report", "--chunked-prefill-size", "256"]  # fmt: skip
    with pytest.raises(TypeError, match="unknown server argument 'no_such_flag'"):
        rg.Runtime(no_such_flag=1)
    with pytest.raises(InvalidRequestError, match="tp_size"):
        rg.Runtime(tp_size=0)  # a value refused here: no process is started
    with pytest.raises(ValueError, match="--schedule-policy: invalid choice: 'nope'"):
        rg.Runtime(schedule_policy="nope")


@pytest.mark.slow
def test_a_server_that_cannot_start_fails_with_its_log():
    with pytest.raises(
        RuntimeError,
        match=r"(?s)exited with status \d+ .*model path '/no/such/model' does not exist",
    ):
        rg.Runtime(model_path="/no/such/model", port=free_port())


@rg.function
def weather(s, city):
    s += rg.user(f"Is {city} usually hot or cold in winter?")
    s += rg.assistant(rg.select("answer", choices=["hot", "cold"]))
    s += rg.user("Say one word about it.")
    s += rg.assistant(rg.gen("word", max_tokens=4, temperature=0))


@pytest.mark.slow
def test_runtime_serves_programs_and_shuts_down_cleanly():
    runtime = rg.Runtime(
        port=free_port(),
        max_running_requests=4,  # SGLang's ServerArgs names
        chunked_prefill_size=512,
        disable_cuda_graph=True,  # SGLang's flag (graphs are CUDA-only: no effect on CPU)
        num_threads=1,
        log_level="warning",
    )
    try:
        info = asyncio.run(runtime.get_server_info())
        assert info["max_running_requests"] == 4 and info["chunked_prefill_size"] == 512
        assert info["port"] == int(runtime.url.rsplit(":", 1)[1])
        pids = [runtime.pid, *(c.pid for c in psutil.Process(runtime.pid).children(True))]
        assert len(pids) >= 3  # the server and its engine processes

        rg.set_default_backend(runtime)  # SGLang's way: the Runtime itself
        state = weather.run(city="Oslo")
        assert state.error() is None
        assert state["answer"] in ("hot", "cold") and state["word"]
        assert state.messages()[0]["role"] == "system"  # the served model's own template

        out = json.loads(
            runtime.generate("The capital of France is", {"max_new_tokens": 3, "temperature": 0})
        )
        assert out["meta_info"]["completion_tokens"] == 3

        async def stream() -> list[str]:
            return [d async for d in runtime.async_generate("One, two,", {"max_new_tokens": 4})]

        deltas = asyncio.run(stream())
        assert deltas and all(deltas)
        assert (
            runtime.get_tokenizer().encode("hello") == runtime.get_tokenizer()("hello")["input_ids"]
        )
        runtime.flush_cache()
    finally:
        runtime.shutdown()
    assert wait_gone(pids) == []
    runtime.shutdown()  # idempotent
    with pytest.raises(requests.ConnectionError):
        requests.get(runtime.url + "/health", timeout=2)
