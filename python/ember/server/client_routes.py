"""The routes clients probe a server with beyond generation: GET /v1/models/{id} (the OpenAI
SDK's models.retrieve), llama-server's /props, vLLM's /version and vLLM's /tokenize fields;
`register` also adds /v1/responses and Anthropic's /v1/messages."""
from __future__ import annotations

import numpy as np
from fastapi import Request

from ..version import __version__
from . import anthropic_messages, openai_responses
from .openai_schema import APIError, get


def shorten_embeddings(vectors: list, dimensions: int) -> list:
    """OpenAI's `dimensions`: each vector's first dimensions values, L2-normalized again (what
    Matryoshka-trained embedding models are made for); 400 past the model's width."""
    width = len(vectors[0]) if vectors else dimensions
    if dimensions > width:
        raise APIError(400, f"'dimensions' is {dimensions}, but this model's embeddings have {width}",
                       param="dimensions", code="invalid_value")
    out = []
    for v in vectors:
        cut = np.asarray(v, dtype=np.float32)[:dimensions]
        norm = float(np.linalg.norm(cut))
        out.append(cut / norm if norm > 0 else cut)
    return out


def is_vllm_tokenize(body: dict) -> bool:
    """Whether a /tokenize body is vLLM's ({"prompt"} or {"messages"}) rather than llama-server's
    ({"content"})."""
    return "content" not in body and ("prompt" in body or "messages" in body)


def vllm_tokenize(srv, body: dict) -> dict:
    """vLLM's /tokenize: a prompt (add_special_tokens: the BOS) or chat messages (rendered by the
    template); the count, the model's length and, with return_token_strs, each token's text."""
    if "messages" in body:
        messages = get(body, "messages", "list", [])
        try:
            text = srv.template.render(messages, add_generation_prompt=get(body, "add_generation_prompt", "bool",
                                                                            True), tools=body.get("tools"))
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from None
        add_special = get(body, "add_special_tokens", "bool", False) and srv.template.add_bos(text)
    else:
        text = get(body, "prompt", "str", "")
        add_special = get(body, "add_special_tokens", "bool", True)
    ids = list(srv.tok.encode(text.encode("utf-8"), add_special, True))
    strs = None
    if get(body, "return_token_strs", "bool", False):
        strs = [bytes(srv.tok.token_to_piece(t, True)).decode("utf-8", errors="replace") for t in ids]
    return {"count": len(ids), "max_model_len": srv.n_ctx, "tokens": ids, "token_strs": strs}


def register(app, srv) -> None:
    @app.api_route("/v1/models/{model_id:path}", methods=["GET", "HEAD"])
    async def model(model_id: str):
        srv.ready()
        srv.check_model(model_id)
        return {"id": srv.model_id, "object": "model", "created": 0, "owned_by": "ember",
                "meta": {"n_ctx": srv.n_ctx, "n_vocab": srv.tok.n_vocab, "max_num_seqs": srv.max_num_seqs}}

    @app.api_route("/version", methods=["GET", "HEAD"])
    async def version():
        return {"version": __version__}

    @app.api_route("/props", methods=["GET", "HEAD"])
    async def props(request: Request):
        srv.ready()
        return {"model_alias": srv.model_id, "total_slots": srv.max_num_seqs, "n_ctx": srv.n_ctx,
                "default_generation_settings": {"n_ctx": srv.n_ctx, "model": srv.model_id},
                "chat_template": srv.template.source, "bos_token": srv.template.bos_token,
                "eos_token": srv.template.eos_token, "build_info": f"ember {__version__}",
                "modalities": {"vision": False, "audio": False}}

    openai_responses.register(app, srv)
    anthropic_messages.register(app, srv)
