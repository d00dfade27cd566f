"""The inter-process protocol (python/radixgen/io_struct.py): per-request output records survive
the wire unchanged, each socket's receivers handle exactly the messages of its union, and an
unknown message type is refused by name."""

from __future__ import annotations

import pickle
from typing import get_args

import pytest

from radixgen.finish_reason import FinishReason
from radixgen.io_struct import (
    BatchEmbeddingOut,
    BatchStrOut,
    BatchTokenIDOut,
    EmbeddingFailure,
    EmbeddingVector,
    LoadLoraAdapterReq,
    MessageDispatch,
    RequestMeta,
    SchedulerInbound,
    TextDelta,
    TokenIDDelta,
    TokenizedEmbeddingReq,
    TokenizedGenerateReq,
    TokenizerInbound,
    UnknownMessageError,
    UnloadLoraAdapterReq,
)

META = RequestMeta(
    3, 2, 1, jump_forward_tokens=1, first_token_delay=0.25, schema_rewrites=("if",),
    schema_checks=("uniqueItems",), schema_check_rollbacks=2,
)  # fmt: skip


def _round_trip(obj: object) -> object:
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def test_output_messages_survive_pickling_field_for_field():
    tokens = BatchTokenIDOut([
        TokenIDDelta(
            "a", 1, [7, 8], FinishReason.stop("x"), META, False, True, True, ["x"], [r"\d"],
            [(-0.5, 7), (None, 8)], [[(-0.5, 7)], None], [(None, 1)], [None],
        ),
        TokenIDDelta("b", 0, [], None, RequestMeta(1, 0, 0), True, False, False),
    ])  # fmt: skip
    texts = BatchStrOut([
        TextDelta("a", "hé", [7, 8], None, META, 2, [(-0.5, 7)], [[(-0.5, 7)]], None, None),
        TextDelta("b", "", [], FinishReason.abort("gone", 499), RequestMeta(1, 0, 0)),
    ])  # fmt: skip
    embeddings = BatchEmbeddingOut(
        [EmbeddingVector("e", 5, [0.25, -1.5]), EmbeddingFailure("f", 0, "the input is empty", 400)]
    )
    assert embeddings.rids == ["e", "f"]
    for msg in (
        tokens, texts, embeddings, BatchTokenIDOut([]), BatchStrOut([]), META, tokens.deltas[0],
    ):  # fmt: skip
        back = _round_trip(msg)
        assert type(back) is type(msg) and back == msg


def test_records_have_no_instance_dict():
    """Slots records: a misspelt field is an error, not a silent new attribute."""
    delta = TokenIDDelta("a", 0, [], None, META, True, True, False)
    with pytest.raises(AttributeError):
        delta.rollbacks = 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        META.cached = 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        EmbeddingVector("e", 1, [1.0]).vector = []  # type: ignore[attr-defined]


def _generate_scheduler_types() -> frozenset[type]:
    from radixgen.runtime.scheduler.scheduler import Scheduler

    # the table is built from bound methods only: no scheduler needs to run for it
    return Scheduler._message_dispatch(object.__new__(Scheduler)).types


def _embedding_scheduler_types() -> frozenset[type]:
    from radixgen.runtime.scheduler.embedding_scheduler import EmbeddingScheduler

    return EmbeddingScheduler._message_dispatch(object.__new__(EmbeddingScheduler)).types


def _tokenizer_manager_types() -> frozenset[type]:
    from radixgen.runtime.request_side.tokenizer_manager import TokenizerManager

    return TokenizerManager._message_dispatch(object.__new__(TokenizerManager)).types


def test_each_receiver_handles_its_sockets_union():
    scheduler_socket = set(get_args(SchedulerInbound))
    assert _generate_scheduler_types() == scheduler_socket - {TokenizedEmbeddingReq}
    assert _embedding_scheduler_types() == scheduler_socket - {
        TokenizedGenerateReq, LoadLoraAdapterReq, UnloadLoraAdapterReq,
    }  # fmt: skip
    assert _tokenizer_manager_types() == set(get_args(TokenizerInbound))


def test_an_unknown_message_type_is_refused_by_name():
    dispatch = MessageDispatch[str]("receiver").on(int, lambda n: f"int {n}")
    assert dispatch(3) == "int 3"
    with pytest.raises(UnknownMessageError, match=r"the receiver cannot handle a str message "
                                                  r"\(it handles int\)"):  # fmt: skip
        dispatch("3")
    with pytest.raises(UnknownMessageError):
        dispatch(True)  # exact types: a bool is not an int here
