"""The `ember-server` command line (llama-server's and vLLM's flag names, declared in ember/options.py)
and what it sets: the engine's keyword arguments and the server's own ServerSettings."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .. import options
from ..options import SERVER
from ..version import add_version


@dataclass
class ServerSettings:
    """What the HTTP side needs beyond the engine. alias: the model id clients see and send (None:
    the GGUF file's name); api_key: None lets every request in; chat_template: a Jinja file that
    replaces the GGUF's; max_queue: requests that may wait for a slot before new ones get 503;
    max_body_bytes: the largest request body accepted; pooling: /v1/embeddings' pooling ("mean",
    "cls", "last", "none", "rank"; None: the GGUF's {arch}.pooling_type, as llama-server's --pooling);
    embedding_only: --embedding / --reranking, generation refused;
    tool_call_parser: the syntax chat replies are parsed for tool calls in (ember.chat's tool
    call styles; None: the one the chat template teaches, as vLLM's --tool-call-parser);
    reasoning_parser: how replies spell their thinking (ember.chat.reasoning's names; "auto": as the
    chat template does); reasoning_budget: the tokens a reply may think when its request does not say
    (-1: no limit); timeout:
    seconds to send a request body or to read a response; cors_origins: origins browsers may call
    the API from ("*": any)."""
    alias: Optional[str] = None
    api_key: Optional[str] = None
    chat_template: Optional[str] = None
    max_queue: int = options.default("max_queue", SERVER)
    max_body_bytes: int = 8 << 20
    pooling: Optional[str] = None
    embedding_only: bool = False
    tool_call_parser: Optional[str] = None
    reasoning_parser: str = "auto"
    reasoning_budget: int = -1
    timeout: float = options.default("timeout", SERVER)
    cors_origins: Tuple[str, ...] = ()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ember-server",
                                description="Serve a GGUF model over an OpenAI-compatible HTTP API, "
                                            "every request sharing one continuous batch.")
    options.add_arguments(p, SERVER)
    add_version(p)
    return p


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    return parser().parse_args(argv)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """AsyncLLMEngine's keyword arguments (as LLM takes them) for these flags."""
    return {**options.values(args, options.LLM), "verbose": True}


def settings(args: argparse.Namespace) -> ServerSettings:
    origins = tuple(o.strip() for o in (args.cors_origin or "").split(",") if o.strip())
    return ServerSettings(alias=args.alias, api_key=args.api_key or None, chat_template=args.chat_template,
                          max_queue=args.max_queue, pooling="rank" if args.reranking else args.pooling,
                          embedding_only=bool(args.embedding or args.reranking), tool_call_parser=args.tool_call_parser,
                          reasoning_parser=args.reasoning_parser, reasoning_budget=args.reasoning_budget,
                          timeout=args.timeout, cors_origins=origins)
