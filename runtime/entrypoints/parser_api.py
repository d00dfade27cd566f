"""SGLang's text-parsing routes (API process): POST /parse_function_call and /separate_reasoning.

They run the same parsers as the chat endpoint on a text the client already has, so a client
that called /generate can still get OpenAI-shaped tool calls or the reasoning split.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from radixgen.errors import InvalidRequestError, RadixGenError
from radixgen.reasoning_parser import REASONING_PARSER_NAMES, ReasoningParser
from radixgen.runtime.entrypoints.http_utils import error_response, json_response, read_parsed
from radixgen.runtime.entrypoints.openai.protocol import Tool, parse_request
from radixgen.runtime.entrypoints.openai.tool_parsers import (
    TOOL_CALL_PARSER_NAMES,
    create_tool_call_parser,
)

router = APIRouter()


class ParseFunctionCallReq(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str
    tools: list[Tool] = Field(default_factory=list)
    tool_call_parser: str | None = None


class SeparateReasoningReq(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str
    reasoning_parser: str


def _check_name(value: str | None, names: tuple[str, ...], field: str) -> None:
    if value is not None and value not in names:
        raise InvalidRequestError(f"{field} must be one of {', '.join(names)}", field)


@router.post("/parse_function_call")
async def parse_function_call(request: Request) -> Response:
    """{"normal_text", "calls": [{"tool_index", "name", "parameters"}]} as SGLang answers."""
    try:
        req = await read_parsed(request, lambda b: parse_request(ParseFunctionCallReq, b))
        _check_name(req.tool_call_parser, TOOL_CALL_PARSER_NAMES, "tool_call_parser")
        if req.tool_call_parser is None:
            args = request.app.state.server.args.parsers
            parser = create_tool_call_parser(args.tool_call_parser)
        else:
            parser = create_tool_call_parser(req.tool_call_parser)
        names = [t.function.name for t in req.tools]
        content, calls = parser.parse(req.text, set(names))
    except RadixGenError as e:
        return error_response(e)
    out = [
        {
            "tool_index": names.index(c["function"]["name"]),
            "name": c["function"]["name"],
            "parameters": c["function"]["arguments"],
        }
        for c in calls
    ]
    return json_response({"normal_text": content or "", "calls": out})


@router.post("/separate_reasoning")
async def separate_reasoning(request: Request) -> Response:
    """{"reasoning_text", "text"} as SGLang answers."""
    try:
        req = await read_parsed(request, lambda b: parse_request(SeparateReasoningReq, b))
        _check_name(req.reasoning_parser, REASONING_PARSER_NAMES, "reasoning_parser")
    except RadixGenError as e:
        return error_response(e)
    reasoning, text = ReasoningParser(req.reasoning_parser).parse(req.text)
    return json_response({"reasoning_text": reasoning or "", "text": text})
