"""A light tokenizer over the `tokenizers` library: encode, decode, token bytes, special ids, chat template.

Used by the API process (tokenize + chat template), the detokenizer (incremental decode) and the
scheduler (stop strings, grammar vocabulary). It never imports torch; transformers is used only as
a fallback for folders without a tokenizer.json.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from radixgen.errors import InvalidRequestError
from radixgen.runtime.text.chat_template import ChatTemplate, RenderedChat


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-character table used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


_BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}


def chat_template_text(value: str | None) -> str | None:
    """`--chat-template` is a file path or the template itself (a path must name a file)."""
    if not value:
        return None
    try:
        path = Path(value).expanduser()
        if path.is_file():
            return path.read_text()
    except OSError:  # an inline template too long to be a file name
        pass
    if "{" not in value:
        raise InvalidRequestError(
            f"chat template {value!r} is neither a file nor a Jinja template", "chat_template"
        )
    return value


def tokenizer_folder(model_folder: str, tokenizer_path: str | None) -> str:
    """`--tokenizer-path` when given (it must exist), else the model's own folder."""
    if tokenizer_path is None:
        return model_folder
    path = Path(tokenizer_path).expanduser()
    if not path.is_dir():
        raise InvalidRequestError(
            f"tokenizer path {tokenizer_path!r} is not a folder (weights and tokenizers are never "
            "downloaded)",
            "tokenizer_path",
        )
    return str(path)


def load_tokenizer(
    model_folder: str, tokenizer_path: str | None, chat_template: str | None
) -> Tokenizer:
    """The tokenizer every process builds from the server's flags."""
    return Tokenizer(tokenizer_folder(model_folder, tokenizer_path), chat_template)


class Tokenizer:
    """What every process needs of a model's tokenizer."""

    def __init__(self, folder: str, chat_template_override: str | None = None) -> None:
        self.folder = Path(folder)
        self._tok = self._load_backend(self.folder)
        self._truncating: dict[int, _HFTokenizer] = {}
        cfg_path = self.folder / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        model_cfg_path = self.folder / "config.json"
        model_cfg = json.loads(model_cfg_path.read_text()) if model_cfg_path.exists() else {}
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        self.bos_token_id = self._id_or_none(self.bos_token)
        eos_ids = model_cfg.get("eos_token_id")
        if eos_ids is None:
            eos_ids = self._id_or_none(self.eos_token)
        if isinstance(eos_ids, int):
            eos_ids = [eos_ids]
        self.eos_token_ids: list[int] = list(eos_ids or [])
        self.eos_token_id: int | None = self.eos_token_ids[0] if self.eos_token_ids else None
        added = self._tok.get_added_tokens_decoder()
        self.special_token_ids: set[int] = {i for i, t in added.items() if t.special}
        self.added_token_ids: set[int] = set(added)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        template = chat_template_text(chat_template_override) or self._find_chat_template()
        self.chat_template = (
            ChatTemplate(template, bos_token=self.bos_token or "", eos_token=self.eos_token or "")
            if template
            else None
        )

    # --- loading ------------------------------------------------------------------------

    @staticmethod
    def _load_backend(folder: Path) -> _HFTokenizer:
        path = folder / "tokenizer.json"
        if path.exists():
            tok = _HFTokenizer.from_file(str(path))
        else:
            from transformers import AutoTokenizer  # slow path: sentencepiece-only folders

            tok = AutoTokenizer.from_pretrained(str(folder)).backend_tokenizer
        # NOTE: a tokenizer.json may carry padding and truncation (all-MiniLM-L6-v2's: both to
        # 128): ids are always the text's own, and an input over a limit is refused, not cut
        tok.no_padding()
        tok.no_truncation()
        return tok

    def _find_chat_template(self) -> str | None:
        jinja = self.folder / "chat_template.jinja"
        if jinja.exists():
            return jinja.read_text()
        template = self.config.get("chat_template")
        if isinstance(template, list):  # HF's named-template form
            named = {t["name"]: t["template"] for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        return template

    def _id_or_none(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    # --- encode / decode ----------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # NOTE: through encode_batch, which releases the GIL while the Rust tokenizer runs
        # (`encode` holds it): the API process tokenizes in worker threads beside its event loop
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def encode_pairs(
        self, pairs: list[tuple[str, str]], truncate_to: int | None = None
    ) -> list[tuple[list[int], list[int]]]:
        """(ids, segment ids) of text pairs encoded as one input each (a cross-encoder's
        query and document: the tokenizer's pair template, e.g. [CLS] q [SEP] d [SEP]).
        truncate_to: cut to that many tokens, the longer text first (see `truncating`)."""
        tok = self._tok if truncate_to is None else self.truncating(truncate_to)
        return [(e.ids, e.type_ids) for e in tok.encode_batch(pairs)]

    def encode_batch_truncated(self, texts: list[str], max_length: int) -> list[list[int]]:
        """Texts cut to `max_length` tokens, special tokens included (as sentence-transformers
        cuts to its max_seq_length: the text is cut, the closing [SEP] kept)."""
        return [e.ids for e in self.truncating(max_length).encode_batch(texts)]

    def truncating(self, max_length: int) -> _HFTokenizer:
        """A copy that cuts every encoding to `max_length` tokens (longest text of a pair
        first); kept per length (a server asks for one: its model's limit)."""
        tok = self._truncating.get(max_length)
        if tok is None:
            tok = _HFTokenizer.from_str(self._tok.to_str())
            tok.enable_truncation(max_length)
            self._truncating[max_length] = tok
        return tok

    @cached_property
    def _plain_text_backend(self) -> _HFTokenizer:
        """A copy that encodes special-token strings as ordinary text (for client content)."""
        plain = _HFTokenizer.from_str(self._tok.to_str())
        plain.encode_special_tokens = True
        return plain

    def encode_plain_text(self, text: str) -> list[int]:
        """`text` with any `<|im_start|>`-like strings in it tokenized as the characters they are."""
        return self._plain_text_backend.encode_batch([text], add_special_tokens=False)[
            0
        ].ids  # GIL off

    def encode_chat(
        self, rendered: RenderedChat, special_tokens_in_content: bool = False
    ) -> list[int]:
        """A rendered chat prompt's ids: control tokens only where the template wrote them.

        Only contents that hold a special-token string are encoded on their own (as plain text);
        the rest of the prompt is encoded in runs as before, so an ordinary chat's ids are the
        same as encoding its whole rendering. With `special_tokens_in_content` the contents may
        hold control tokens too (the old behaviour: a client can then open a system turn).
        """
        if special_tokens_in_content:
            return self.encode(rendered.text, add_special_tokens=False)
        ids: list[int] = []
        run: list[str] = []
        for text, from_content in rendered.segments:
            if from_content and self.holds_special_token(text):
                if run:
                    ids += self.encode("".join(run), add_special_tokens=False)
                    run = []
                ids += self.encode_plain_text(text)
            else:
                run.append(text)
        if run:
            ids += self.encode("".join(run), add_special_tokens=False)
        return ids

    @cached_property
    def special_token_strings(self) -> tuple[str, ...]:
        added = self._tok.get_added_tokens_decoder()
        return tuple(t.content for i, t in added.items() if i in self.special_token_ids)

    def holds_special_token(self, text: str) -> bool:
        """Whether `text` has a string the tokenizer would turn into a special token."""
        return any(s in text for s in self.special_token_strings)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return self._tok.decode_batch(batch, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def token_text(self, token_id: int) -> str:
        """The text of one token as a client sees it (used for logprob entries)."""
        return self._tok.decode([token_id], skip_special_tokens=False)

    @cached_property
    def is_byte_level(self) -> bool:
        dec = json.loads(self._tok.to_str()).get("decoder") or {}
        kinds = [dec.get("type")] + [d.get("type") for d in dec.get("decoders", []) or []]
        return "ByteLevel" in kinds

    @cached_property
    def token_bytes(self) -> list[bytes]:
        """Raw bytes of every token id (b"" for added/special tokens): the grammar vocabulary."""
        out: list[bytes] = []
        byte_level = self.is_byte_level
        for i in range(self.vocab_size):
            if i in self.added_token_ids:
                out.append(b"")
                continue
            piece = self._tok.id_to_token(i)
            if piece is None:
                out.append(b"")
            elif byte_level:
                out.append(bytes(_BYTE_DECODER.get(c, 0) for c in piece))
            else:
                out.append(_sentencepiece_bytes(piece))
        return out

    # --- chat ---------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, object]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, object]] | None = None,
        **extra: object,
    ) -> str:
        if self.chat_template is None:
            raise ValueError("this model has no chat template; pass --chat-template")
        return self.chat_template.render(
            messages, add_generation_prompt=add_generation_prompt, tools=tools, **extra
        )

    def render_chat(
        self,
        messages: Sequence[Mapping[str, object]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, object]] | None = None,
        **extra: object,
    ) -> RenderedChat:
        """Like `apply_chat_template`, with the message contents marked (see `encode_chat`)."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template; pass --chat-template")
        return self.chat_template.render_chat(messages, add_generation_prompt, tools, **extra)


def _token_text(value: object) -> str | None:
    """A special token's text in tokenizer_config.json: a string, or an AddedToken dict."""
    text = value.get("content") if isinstance(value, dict) else value
    return text if isinstance(text, str) else None


def _sentencepiece_bytes(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("▁", " ").encode("utf-8")
