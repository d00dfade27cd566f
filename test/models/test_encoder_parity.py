"""Our encoder reproduces transformers' token states (tiny random BertModel and XLMRobertaModel
built here), and its pooled vectors sentence-transformers' on the default embedding model.

The real-model check embeds 50 varied texts batched and each alone: the vectors must match
sentence-transformers' (cosine >= 0.9999) and each other to float32 rounding.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from radixgen.runtime.layers.pooling import finish_vector, pool
from radixgen.runtime.model_executor.embedding_runner import EmbeddingJob, EmbeddingRunner
from radixgen.runtime.model_loader.weights import iter_weights
from radixgen.runtime.models.bert import BertModel
from radixgen.runtime.models.encoder_config import EncoderArchConfig
from radixgen.runtime.models.sentence_config import PoolingConfig

transformers = pytest.importorskip("transformers")

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "How do I reset my password?",
    "Password reset instructions are sent by email within five minutes.",
    "Radix trees share prefixes between requests, so repeated prompts prefill once.",
    "def add(a, b):\n    return a + b",
    "SELECT name, count(*) FROM users GROUP BY name HAVING count(*) > 1;",
    "Paris is the capital and most populous city of France.",
    "Berlin ist die Hauptstadt Deutschlands.",
    "東京は日本の首都です。",
    "¿Dónde está la biblioteca?",
    "Emoji test: 🚀🔥 launch day!",
    "",
    "a",
    "OK",
    "1234567890",
    "e^{i\\pi} + 1 = 0",
    "The mitochondria is the powerhouse of the cell.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The stock market fell sharply after the central bank raised interest rates.",
    "Interest rates were raised by the central bank, and stocks dropped.",
    "I love this movie, it was fantastic!",
    "This film was terrible and boring.",
    "Please summarize the following document in three bullet points.",
    "Translate 'good morning' into Spanish.",
    "The patient presented with fever, cough and shortness of breath.",
    "Quantum entanglement links particles regardless of the distance between them.",
    "Return the top five results sorted by relevance score.",
    "   leading and trailing spaces   ",
    "UPPER CASE TEXT SHOULD BE LOWERCASED BY THE TOKENIZER",
    "tabs\tand\nnewlines\nin\ttext",
    "https://example.com/path?query=1&other=two#fragment",
    "user@example.com wrote: see you at 10:30am on 2026-12-03",
    "C'est la vie, mon ami.",
    "The cat sat on the mat. " * 8,
    "Machine learning models need careful evaluation on held-out data to avoid overfitting, "
    "and their errors should be analysed by slice rather than only in aggregate.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.",
    "What is the boiling point of water at sea level?",
    "Water boils at 100 degrees Celsius at standard atmospheric pressure.",
    "Зима близко.",
    "नमस्ते दुनिया",
    "A very long sentence " + " ".join(f"word{i}" for i in range(60)),
]
COSINE_MIN = 0.9999


def _tiny_config(arch: str) -> object:
    common = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        hidden_act="gelu",
        attn_implementation="eager",
    )
    if arch == "BertModel":
        return transformers.BertConfig(**common, type_vocab_size=2, pad_token_id=0)
    return transformers.XLMRobertaConfig(**common, type_vocab_size=1, pad_token_id=1)


@pytest.mark.parametrize("arch", ["BertModel", "XLMRobertaModel"])
def test_token_states_match_transformers(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    hf_cls = getattr(transformers, arch)
    hf = hf_cls(_tiny_config(arch), add_pooling_layer=True).eval()
    hf.save_pretrained(tmp_path)
    cfg = EncoderArchConfig.from_folder(tmp_path)
    ours = BertModel.create(cfg, torch.float32, "cpu")
    ours.load_weights(iter_weights(tmp_path))

    lengths = [11, 3, 1, 7]
    pad = cfg.pad_token_id
    ids = torch.full((len(lengths), max(lengths)), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(2, cfg.vocab_size, (n,))
        mask[row, :n] = 1
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    got = ours(ids, mask)
    for row, n in enumerate(lengths):  # padded rows are never read
        torch.testing.assert_close(got[row, :n], want[row, :n], rtol=1e-4, atol=1e-5)
    # each sequence alone gives its batched states
    alone = ours(ids[2:3, : lengths[2]], mask[2:3, : lengths[2]])
    torch.testing.assert_close(alone[0], got[2, : lengths[2]], rtol=1e-5, atol=1e-6)
    # the unpacked path (F.linear: CUDA, bf16, no oneDNN) gives the same states
    assert all(layer.up_gemm.packed for layer in ours.layers), "float32 CPU layers run oneDNN"
    plain = BertModel.create(cfg, torch.float32, "cpu")
    plain.load_weights(iter_weights(tmp_path), pack=False)
    assert not any(layer.up_gemm.packed for layer in plain.layers)
    with pytest.raises(RuntimeError, match="fresh model"):  # the packed copy is the only one
        ours.load_weights(iter_weights(tmp_path))
    torch.testing.assert_close(plain(ids, mask), got, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "arch", ["BertForSequenceClassification", "XLMRobertaForSequenceClassification"]
)
def test_cross_encoder_scores_match_transformers(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(1)
    base = "BertModel" if arch.startswith("Bert") else "XLMRobertaModel"
    config = _tiny_config(base)
    config.num_labels = 1
    config.type_vocab_size = 2
    hf = getattr(transformers, arch)(config).eval()
    hf.save_pretrained(tmp_path)
    runner = EmbeddingRunner(tmp_path)
    assert runner.cfg.is_cross_encoder and runner.hidden_size == 1

    # (query, document) pairs: segment 0 then segment 1, of different lengths
    pairs = [(4, 9), (2, 3), (6, 1)]
    jobs, ids_rows, type_rows = [], [], []
    for q, d in pairs:
        ids = torch.randint(2, config.vocab_size, (q + d,)).tolist()
        types = [0] * q + [1] * d
        jobs.append(EmbeddingJob(ids, None, types))
        ids_rows.append(ids)
        type_rows.append(types)
    got = torch.stack(runner.embed(jobs))[:, 0]
    for row, (ids, types) in enumerate(zip(ids_rows, type_rows, strict=True)):
        with torch.no_grad():
            logit = hf(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits[
                0, 0
            ]
        torch.testing.assert_close(got[row], torch.sigmoid(logit), rtol=1e-5, atol=1e-6)


def test_pooling_modes() -> None:
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert pool(hidden, mask, "cls").tolist() == [[0, 1], [6, 7]]
    assert pool(hidden, mask, "last").tolist() == [[4, 5], [8, 9]]
    assert pool(hidden, mask, "mean").tolist() == [[2, 3], [7, 8]]
    vec = finish_vector(torch.tensor([3.0, 4.0, 12.0]), True, 2)
    torch.testing.assert_close(vec, torch.tensor([0.6, 0.8]))


def test_sentence_transformers_config(tmp_path: Path) -> None:
    (tmp_path / "1_Pooling").mkdir()
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    cfg = PoolingConfig.from_folder(tmp_path, "mean")
    assert (cfg.mode, cfg.normalize, cfg.max_seq_length) == ("cls", False, 128)
    assert PoolingConfig.from_folder(tmp_path, "mean", "last").mode == "last"
    assert PoolingConfig.from_folder(tmp_path / "1_Pooling", "mean").mode == "mean"  # no ST files


@pytest.fixture(scope="module")
def minilm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from radixgen.runtime.model_loader.default_embedding import unpack_default_embedding_model

    pytest.importorskip("sentence_transformers")
    try:
        return unpack_default_embedding_model(tmp_path_factory.mktemp("cache"))
    except Exception as e:  # the model package is a test extra
        pytest.skip(f"default embedding model not installed: {e}")


def test_default_model_matches_sentence_transformers(minilm_folder: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from radixgen.runtime.text.tokenizer import load_tokenizer

    st = SentenceTransformer(str(minilm_folder), device="cpu")
    want = st.encode(TEXTS, convert_to_tensor=True, batch_size=16).float()

    runner = EmbeddingRunner(minilm_folder, max_batch_tokens=2048)
    assert (runner.pooling.mode, runner.pooling.normalize) == ("mean", True)
    assert runner.max_input_tokens == 256
    tokenizer = load_tokenizer(str(minilm_folder), None, None)
    ids = tokenizer.encode_batch(TEXTS, True)
    st_ids = st.tokenize(TEXTS)["input_ids"]
    for mine, theirs, m in zip(ids, st_ids, st.tokenize(TEXTS)["attention_mask"], strict=True):
        assert mine == theirs[: int(m.sum())].tolist()

    batched = torch.stack(runner.embed([EmbeddingJob(i) for i in ids]))
    alone = torch.stack([runner.embed([EmbeddingJob(i)])[0] for i in ids])
    cos = torch.nn.functional.cosine_similarity(batched, want, dim=-1)
    assert cos.min().item() >= COSINE_MIN, f"min cosine {cos.min().item():.6f}"
    torch.testing.assert_close(alone, batched, rtol=0, atol=1e-6)
    torch.testing.assert_close(batched.norm(dim=-1), torch.ones(len(TEXTS)))
