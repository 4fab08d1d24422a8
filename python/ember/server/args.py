"""The `ember-server` command line (llama-server's and vLLM's flag names) and what it sets: the
engine's keyword arguments and the server's own ServerSettings."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import List, Optional

from ..chat import ToolCallParser
from ..llama import add_kv_cache_args, kv_cache_types


@dataclass
class ServerSettings:
    """What the HTTP side needs beyond the engine. alias: the model id clients see and send (None:
    the GGUF file's name); api_key: None lets every request in; chat_template: a Jinja file that
    replaces the GGUF's; max_queue: requests that may wait for a slot before new ones get 503;
    max_body_bytes: the largest request body accepted; pooling: /v1/embeddings' pooling ("mean",
    "cls", "last", "none"; None: the GGUF's {arch}.pooling_type, as llama-server's --pooling);
    tool_call_parser: the syntax chat replies are parsed for tool calls in (ember.chat.tool_calls'
    styles; None: the one the chat template teaches, as vLLM's --tool-call-parser)."""
    alias: Optional[str] = None
    api_key: Optional[str] = None
    chat_template: Optional[str] = None
    max_queue: int = 256
    max_body_bytes: int = 8 << 20
    pooling: Optional[str] = None
    tool_call_parser: Optional[str] = None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ember-server",
                                description="Serve a GGUF model over an OpenAI-compatible HTTP API, "
                                            "every request sharing one continuous batch.")
    p.add_argument("-m", "--model", required=True, help="path of the GGUF model file")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096,
                   help="the longest sequence, prompt + generated tokens (0: the model's; default 4096)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="blocks on the GPU (-1: all)")
    p.add_argument("-np", "--max-num-seqs", "--parallel", dest="max_num_seqs", type=int, default=64,
                   help="sequences decoded at once; more requests wait (default 64)")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    add_kv_cache_args(p)
    p.add_argument("--kv-mb", type=float, default=0.0,
                   help="MiB of KV cache shared by all sequences (default: room for -np full sequences, at most 4 GiB)")
    p.add_argument("--kv-host-mb", type=float, default=0.0,
                   help="MiB of host memory for the KV host tier: preempted sequences swap out to it and evicted "
                        "prefix-cache blocks stay in it (default 0: none; docs/engine.md)")
    p.add_argument("-b", "--batch-size", "--max-num-batched-tokens", dest="max_num_batched_tokens", type=int,
                   default=512, help="tokens of one forward step, prompt chunks and decodes together (default 512)")
    p.add_argument("--api-key", default=os.environ.get("EMBER_API_KEY"),
                   help="require `Authorization: Bearer KEY` (default: $EMBER_API_KEY; none: open)")
    p.add_argument("--chat-template", metavar="FILE", default=None,
                   help="a Jinja chat template file, used instead of the GGUF's tokenizer.chat_template")
    p.add_argument("--alias", default=None, help="the model id in the API (default: the file name)")
    p.add_argument("--max-queue", type=int, default=ServerSettings.max_queue,
                   help=f"requests that may wait for a slot; past that, 503 (default {ServerSettings.max_queue})")
    p.add_argument("--pooling", choices=["none", "mean", "cls", "last"], default=None,
                   help="pooling of /v1/embeddings (default: the model's {arch}.pooling_type, else none, "
                        "which /v1/embeddings refuses as llama-server does)")
    p.add_argument("--tool-call-parser", choices=list(ToolCallParser.STYLES), default=None,
                   help="the syntax replies are parsed for tool calls in: hermes (<tool_call> blocks), mistral "
                        "([TOOL_CALLS]), json (Llama 3's JSON replies); default: the one the chat template uses")
    p.add_argument("--deterministic", action="store_true",
                   help="a request's tokens do not depend on the rest of the batch (docs/engine.md)")
    return p


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.max_queue < 0:
        p.error(f"--max-queue must be >= 0, got {args.max_queue}")
    if args.max_num_seqs < 1:
        p.error(f"-np/--max-num-seqs must be >= 1, got {args.max_num_seqs}")
    if args.max_num_batched_tokens < 1:
        p.error(f"-b/--batch-size must be >= 1, got {args.max_num_batched_tokens}")
    for flag, value in (("--kv-mb", args.kv_mb), ("--kv-host-mb", args.kv_host_mb)):
        if value < 0:
            p.error(f"{flag} must be >= 0, got {value:g}")
    return args


def engine_kwargs(args: argparse.Namespace) -> dict:
    """AsyncLLMEngine's keyword arguments (as LLM takes them) for these flags."""
    type_k, type_v = kv_cache_types(args.cache_type_k, args.cache_type_v)
    return dict(n_ctx=args.ctx_size, n_gpu_layers=args.n_gpu_layers, n_threads=args.threads,
                max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                kv_mb=args.kv_mb, kv_host_mb=args.kv_host_mb, type_k=type_k, type_v=type_v,
                deterministic=args.deterministic, offload_kqv=not args.no_kv_offload,
                kv_gpu_cache_mb=args.kv_gpu_cache_mb, verbose=True)


def settings(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(alias=args.alias, api_key=args.api_key or None, chat_template=args.chat_template,
                          max_queue=args.max_queue, pooling=args.pooling, tool_call_parser=args.tool_call_parser)
