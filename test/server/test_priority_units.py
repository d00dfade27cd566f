"""Priority scheduling's flags and request fields as plain functions (no server): SGLang's
launch flags, `priority` on /generate and the OpenAI bodies, and how a request's priority is
resolved before it is sent."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from radixgen.cli import build_parser
from radixgen.errors import InvalidRequestError
from radixgen.io_struct import GenerateReqInput
from radixgen.runtime.entrypoints.generate_request import parse_generate_request
from radixgen.runtime.entrypoints.openai import serving_common as common
from radixgen.runtime.entrypoints.openai.protocol import ChatCompletionRequest, parse_request
from radixgen.runtime.request_side.request_checks import resolve_priority
from radixgen.server_args import ServerArgs, from_cli_namespace
from radixgen.sglang_flag_table import IMPLEMENTED


def test_sglang_priority_flags_set_the_scheduler_config():
    ns = build_parser().parse_args(
        ["serve", "--enable-priority-scheduling", "--schedule-low-priority-values-first",
         "--default-priority-value", "7", "--abort-on-priority-when-disabled",
         "--disable-priority-preemption", "--priority-scheduling-preemption-threshold", "3"]
    )  # fmt: skip
    s = from_cli_namespace(ns).scheduler
    assert s.enable_priority_scheduling and s.schedule_low_priority_values_first
    assert s.default_priority_value == 7 and s.abort_on_priority_when_disabled
    assert s.disable_priority_preemption and s.priority_scheduling_preemption_threshold == 3
    assert "enable-priority-scheduling" in IMPLEMENTED


def test_a_negative_preemption_threshold_is_refused():
    with pytest.raises(InvalidRequestError, match="preemption_threshold"):
        ServerArgs.from_kwargs(priority_scheduling_preemption_threshold=-1)


def test_priority_is_read_on_generate_and_openai_bodies():
    assert parse_generate_request({"text": "a", "priority": 4}).priority == 4
    assert parse_generate_request({"text": "a"}).priority is None
    with pytest.raises(InvalidRequestError) as e:
        parse_generate_request({"text": "a", "priority": "high"})
    assert e.value.param == "priority"
    body = {"messages": [{"role": "user", "content": "hi"}], "priority": -2}
    assert parse_request(ChatCompletionRequest, body).priority == -2


def test_priority_resolution_follows_sglang():
    on = ServerArgs.from_kwargs(enable_priority_scheduling=True).scheduler
    assert resolve_priority(5, on) == 5 and resolve_priority(None, on) == 0
    with_default = ServerArgs.from_kwargs(
        enable_priority_scheduling=True, default_priority_value=3
    ).scheduler
    assert resolve_priority(None, with_default) == 3 and resolve_priority(-1, with_default) == -1
    off = ServerArgs.from_kwargs().scheduler
    assert resolve_priority(99, off) == 0  # ignored while priority scheduling is off
    strict = ServerArgs.from_kwargs(abort_on_priority_when_disabled=True).scheduler
    assert resolve_priority(None, strict) == 0
    with pytest.raises(InvalidRequestError) as e:
        resolve_priority(99, strict)
    assert e.value.param == "priority"


def test_a_batch_line_is_sent_as_background_work_with_its_priority():
    sent: list[GenerateReqInput] = []

    class FakeManager:
        async def generate(self, obj: GenerateReqInput):
            sent.append(obj)
            yield {"meta_info": {"finish_reason": {"type": "length"}}}

    class Plan:
        def __init__(self, req: ChatCompletionRequest, tm: FakeManager) -> None:
            self.req = req

        def generate_input(self) -> GenerateReqInput:
            return GenerateReqInput(text="x", priority=self.req.priority)

    args = SimpleNamespace(http=SimpleNamespace(enable_cache_report=False))
    state = SimpleNamespace(manager=FakeManager, args=args)
    body = {"messages": [{"role": "user", "content": "hi"}], "priority": 3}
    status, _ = asyncio.run(
        common.generate_json(
            state, ChatCompletionRequest, Plan, lambda *a: {"ok": 1}, "messages", body
        )
    )
    assert status == 200 and sent[0].background and sent[0].priority == 3
