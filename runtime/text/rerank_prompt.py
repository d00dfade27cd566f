"""The prompt a yes/no decoder reranker answers for one (query, document) pair (API process).

Qwen3-Reranker's format is the default: a system turn asking for "yes" or "no", the user turn
with an instruction, the query and the document, and the assistant turn opened past an empty
think block, so the next token is the answer whose probability ranks the document.
"""

from __future__ import annotations

import re
from pathlib import Path

from radixgen.errors import InvalidRequestError

DEFAULT_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


def rerank_template(value: str | None) -> str:
    """The --rerank-template flag's text (a file's content, or the value itself), checked."""
    if value is None:
        return DEFAULT_RERANK_TEMPLATE
    path = Path(value)
    text = path.read_text() if len(value) < 4096 and path.is_file() else value
    if "{query}" not in text or "{document}" not in text:
        raise InvalidRequestError(
            "--rerank-template must hold both {query} and {document}", "rerank_template"
        )
    return text


def rerank_prompt(template: str, query: str, document: str) -> str:
    """The template with the pair put in, in one pass (a "{query}" inside the document stays)."""
    texts = {"query": query, "document": document}
    return re.sub(r"\{(query|document)\}", lambda m: texts[m.group(1)], template)


def parse_reranker_tokens(value: str) -> tuple[str, str]:
    """'yes,no' -> ("yes", "no")."""
    parts = [p.strip() for p in value.split(",")]
    if len(parts) != 2 or not all(parts):
        raise InvalidRequestError(
            f"--reranker-tokens takes two answers, like 'yes,no'; got {value!r}", "reranker_tokens"
        )
    return parts[0], parts[1]
