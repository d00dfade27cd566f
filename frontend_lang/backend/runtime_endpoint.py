"""RuntimeEndpoint: a RadixGen (or SGLang) server over its native HTTP API.

The chat template is the served model's own: the Jinja source from /get_model_info when the
server reports one, else the tokenizer folder it names when that folder is readable here (same
machine), else a template picked by model name. Any non-200 answer raises BackendError. In a run
with `trace=True` each /generate body carries the call's `program_trace` (a RadixGen server's
field: SGLang's server refuses it).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import requests

from radixgen.json_types import JSONObject, JSONValue
from radixgen.lang.adapter_scope import with_adapter
from radixgen.lang.backend.native import NativeBackend
from radixgen.lang.chat_template import (
    ChatTemplate,
    TemplateShapeError,
    chat_template_for_source,
    chat_template_from_folder,
    get_chat_template,
    get_chat_template_by_model_path,
)
from radixgen.lang.errors import BackendError
from radixgen.lang.run_trace import with_trace

logger = logging.getLogger(__name__)


class RuntimeEndpoint(NativeBackend):
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: bool | str | None = None,
        chat_template_name: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        super().__init__()
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.verify = verify
        self.timeout = timeout
        self._local = threading.local()  # one keep-alive session per thread
        self.model_info: dict[str, Any] = self._request("GET", "/get_model_info").json()
        if chat_template_name:
            self.chat_template = get_chat_template(chat_template_name)
        else:
            self.chat_template = template_for_model(self.model_info)
        self._can_tokenize = True

    # --- HTTP ------------------------------------------------------------------------------

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            if self.api_key:
                session.headers["Authorization"] = f"Bearer {self.api_key}"
        return session

    def _request(
        self, method: str, path: str, body: JSONValue = None, stream: bool = False
    ) -> requests.Response:
        url = self.base_url + path
        try:
            res = self._session().request(
                method, url, json=body, stream=stream, timeout=self.timeout, verify=self.verify
            )
        except requests.RequestException as e:
            raise BackendError(f"cannot reach {url}: {e}") from e
        if res.status_code != 200:
            raise BackendError(f"{method} {path} -> {res.status_code}: {_error_text(res)}",
                               res.status_code)  # fmt: skip
        return res

    def _post(self, payload: dict[str, Any]) -> Any:
        return self._request("POST", "/generate", with_trace(with_adapter(payload))).json()

    def _post_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        res = self._request("POST", "/generate", with_trace(with_adapter(payload)), stream=True)
        with res:
            for line in res.iter_lines(decode_unicode=False):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                yield json.loads(data)

    def count_prompt_tokens(self, text: str) -> int:
        """From /tokenize (no model work); servers without it get a prefill-only request."""
        if self._can_tokenize:
            try:
                return int(self._request("POST", "/tokenize", {"text": text}).json()["count"])
            except (BackendError, KeyError, ValueError) as e:
                if isinstance(e, BackendError) and e.status not in (404, 405):
                    raise
                self._can_tokenize = False
        return super().count_prompt_tokens(text)

    # --- control ---------------------------------------------------------------------------

    def get_model_name(self) -> str:
        return str(self.model_info.get("model_path", ""))

    def flush_cache(self) -> None:
        self._request("POST", "/flush_cache")

    def get_server_info(self) -> JSONObject:
        info: JSONObject = self._request("GET", "/server_info").json()
        return info

    def __repr__(self) -> str:
        return f"RuntimeEndpoint({self.base_url!r})"


def template_for_model(model_info: dict[str, Any]) -> ChatTemplate:
    """The served model's template: reported Jinja source, local tokenizer folder (either read
    off the Jinja or recognised by its family's markers), or by the model's name."""
    name = str(model_info.get("model_path") or model_info.get("served_model_name") or "")
    source = model_info.get("chat_template")
    try:
        if isinstance(source, str) and source:
            eos = model_info.get("eos_token") or ""
            return chat_template_for_source(source, eos_token=eos, name=name)
        folder = model_info.get("tokenizer_path")
        if isinstance(folder, str) and folder:
            template = chat_template_from_folder(folder)
            if template is not None:
                return dataclasses.replace(template, name=name)
    except TemplateShapeError as e:
        logger.warning("chat template of %s not usable (%s); choosing one by name", name, e)
    return get_chat_template_by_model_path(name)


def _error_text(res: requests.Response) -> str:
    try:
        body = res.json()
    except ValueError:
        return res.text.strip()[:500]
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err)
