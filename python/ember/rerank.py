"""(query, document) pairs as a reranker reads them, and their scores: a GGUF's rerank prompt template
(tokenizer.chat_template.rerank, with {query} and {document}; Qwen3-Reranker's), BERT's pair layout
([CLS] query [SEP] document [SEP], token types 0 then 1) for WordPiece vocabularies, else llama.cpp's
(BOS query EOS SEP document EOS, as the vocabulary adds them: XLM-RoBERTa's <s> A </s></s> B </s>).
The server's /v1/rerank and /score and LLM.score share it."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from . import _ember
from .embedding import Embedder

RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"


def rerank_template(model) -> Optional[str]:
    """The model's rerank prompt template, None without one."""
    text = _ember.GGUFFile(model.path, False).get_string(RERANK_TEMPLATE_KEY, "")
    return text or None


def encode_pair(tok, query: str, document: str, template: Optional[str] = None) -> Tuple[List[int], List[int]]:
    """The token ids and token types of one (query, document) pair."""
    if not isinstance(query, str) or not isinstance(document, str):
        raise TypeError("a query and a document must be str")
    if template is not None:
        text = template.replace("{query}", query).replace("{document}", document)
        ids = list(tok.encode(text.encode("utf-8"), False, True))
        return ids, [0] * len(ids)
    q = list(tok.encode(query.encode("utf-8"), False, False))
    d = list(tok.encode(document.encode("utf-8"), False, False))
    if tok.model == "bert" and tok.sep >= 0 and tok.bos >= 0:
        first = [tok.bos, *q, tok.sep]
        second = [*d, tok.sep]
        return first + second, [0] * len(first) + [1] * len(second)
    end = tok.eos if tok.eos >= 0 else tok.sep
    ids = [tok.bos] if tok.add_bos and tok.bos >= 0 else []
    ids += q
    if tok.add_eos and end >= 0:
        ids.append(end)
    if tok.add_sep and tok.sep >= 0:
        ids.append(tok.sep)
    ids += d
    if tok.add_eos and end >= 0:
        ids.append(end)
    return ids, [0] * len(ids)


def score_pairs(embedder: Embedder, tok, template: Optional[str], queries: Sequence[str],
                documents: Sequence[str]) -> Tuple[List[float], int]:
    """The rank scores of queries[i] against documents[i] and the tokens they took."""
    if len(queries) != len(documents):
        raise ValueError(f"{len(queries)} queries for {len(documents)} documents")
    pairs = [encode_pair(tok, q, d, template) for q, d in zip(queries, documents)]
    for i, (ids, _) in enumerate(pairs):
        if len(ids) > embedder.n_ctx:
            raise ValueError(f"pair {i} is {len(ids)} tokens, more than the context of {embedder.n_ctx}")
    scores = embedder.score_batch([p[0] for p in pairs], [p[1] for p in pairs])
    return scores, sum(len(p[0]) for p in pairs)
