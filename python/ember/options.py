"""ember's user-facing options, each declared once: its Python keyword, its command-line flags (as
llama.cpp spells them, with vLLM's where ember-server takes them), environment variable, type,
default, help, section and checks. Every CLI, `Llama`, `LLM` and docs/options.md take them from here."""
from __future__ import annotations

import argparse
import inspect
import math
import numbers
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple

from .chat.reasoning import CHOICES as REASONING_PARSERS
from .chat.tool_calls import ToolCallParser
from .embedding import POOLING_NAMES, POOLING_UNSPECIFIED

# The front ends, by the name a user knows them by.
LLAMA, LLM = "Llama", "LLM"
EMBER, BENCH, PERPLEXITY = "ember", "ember-bench", "ember-perplexity"
SERVER, QUANTIZE = "ember-server", "ember-quantize"
CLIS = (EMBER, BENCH, PERPLEXITY, SERVER, QUANTIZE)

# KV cache types by ggml type id, as llama-cpp-python's type_k / type_v take them.
_KV_TYPE_IDS = {1: "f16", 30: "bf16", 0: "f32", 8: "q8_0", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 20: "iq4_nl"}
KV_CACHE_TYPES = tuple(_KV_TYPE_IDS.values())   # names, as the tools' -ctk / -ctv take them


def kv_type(value) -> str:
    """A KV cache type's name from a name or a ggml type id (None: f16)."""
    if value is None:
        return "f16"
    if isinstance(value, str) and value in KV_CACHE_TYPES:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) in _KV_TYPE_IDS:
        return _KV_TYPE_IDS[int(value)]
    raise ValueError("must be a KV cache type: 1 or 'f16', 30 or 'bf16', 0 or 'f32', 8 or 'q8_0', 2 or 'q4_0', "
                     "3 or 'q4_1', 6 or 'q5_0', 7 or 'q5_1', 20 or 'iq4_nl'")


def _boolean(value) -> bool:
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("1", "true", "on", "yes"):
            return True
        if word in ("0", "false", "off", "no"):
            return False
        raise ValueError("must be 0 or 1 (true / false)")
    if isinstance(value, (bool, numbers.Integral)) and int(value) in (0, 1):
        return bool(value)
    raise ValueError("must be True or False")


def _integer(value) -> int:
    if isinstance(value, str):
        value = value.strip()
        try:
            return int(value)
        except ValueError:
            raise ValueError("must be a whole number") from None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise ValueError("must be a whole number")


def _number(value) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError("must be a number") from None
    if isinstance(value, bool) or not math.isfinite(out):
        raise ValueError("must be a finite number")
    return out


_DEVICES = ("cpu", "cuda", "gpu")


def tensor_overrides(value) -> list:
    """llama.cpp's -ot values as a list of "REGEX=DEVICE" (one string, a comma-separated list as
    -ot takes it, or a list of those); each device CPU or CUDA (CUDA0, GPU). The regular expressions
    are checked where the model loads (ECMAScript syntax, as llama.cpp's)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise ValueError("must be REGEX=DEVICE strings")
    out = []
    for item in (part for entry in items for part in entry.split(",")):
        pattern, eq, device = item.rpartition("=")
        if not eq or not pattern or not device:
            raise ValueError("must be REGEX=DEVICE (e.g. exps=CPU)")
        name = device.lower()
        if name not in _DEVICES and not (name.startswith("cuda") and name[4:].isdigit()):
            raise ValueError(f"names unknown device {device!r} (CPU or CUDA)")
        out.append(item)
    return out


def _text(value) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a str")
    return value


@dataclass(frozen=True)
class Option:
    """One option. `default` holds for every front end but those `defaults` names; None leaves it
    unset, and `unset` says what that means (all cores, random, the GGUF's ...). `minimum` bounds
    numbers; `choices` lists the values allowed. `fields` names the C++ params structs
    ("ModelParams", "ContextParams", "EngineParams") whose field `field` (the option's name unless
    given) it sets. A bool with `negative` flags sets False through them; its own flags take an
    optional 0/1."""
    name: str
    section: str
    help: str
    type: Callable[[Any], Any] = _text
    default: Any = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    flags: Tuple[str, ...] = ()
    negative: Tuple[str, ...] = ()
    env: Optional[str] = None
    choices: Optional[Tuple[Any, ...]] = None
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    fields: Tuple[str, ...] = ()
    field: Optional[str] = None
    metavar: Optional[str] = None
    required: bool = False   # on the command line
    repeat: bool = False     # its flag may be given more than once, each adding to a list
    unset: Optional[str] = None

    def default_for(self, front_end: str):
        return self.defaults.get(front_end, self.default)

    def check(self, value):
        """value as this option holds it; ValueError saying what is wrong (without the name)."""
        if value is None:
            return None
        value = self.type(value)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"must be one of {', '.join(map(str, self.choices))}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"must be >= {self.minimum:g}")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"must be <= {self.maximum:g}")
        return value


_CTX, _ENG, _MOD = "ContextParams", "EngineParams", "ModelParams"
_ENGINE_FRONT_ENDS = {LLM: 4096, SERVER: 4096}

_OPTIONS = (
    # ---- model ----
    Option("model", "model", "path of the GGUF model file", flags=("-m", "--model"), metavar="FILE", required=True),
    Option("n_gpu_layers", "model", "blocks on the GPU, the last ones first (-1: all)", _integer, 0,
           flags=("-ngl", "--gpu-layers", "--n-gpu-layers"), minimum=-1, fields=(_MOD,), metavar="N"),
    Option("main_gpu", "model", "the GPU that holds the offloaded blocks", _integer, 0, flags=("-mg", "--main-gpu"),
           minimum=0, fields=(_MOD,), metavar="INDEX"),
    Option("use_mmap", "model", "read CPU-resident weights from the file mapping (0: copy them into huge-page "
           "host memory at load)", _boolean, True, flags=("-mmp", "--mmap"), negative=("--no-mmap",),
           fields=(_MOD,)),
    Option("dtype", "model", "vLLM's compute type, checked against the file: auto, or the float type an unquantized "
           "GGUF holds (float16, bfloat16, float32)", default="auto", flags=("--dtype",)),
    Option("override_tensor", "model", "REGEX=DEVICE: tensors whose name matches REGEX go on DEVICE, CPU or CUDA; "
           "repeatable or comma-separated, the first match deciding, before --n-cpu-moe and --cpu-moe "
           "(docs/placement.md)", tensor_overrides, flags=("-ot", "--override-tensor"), fields=(_MOD,),
           metavar="REGEX=DEVICE", repeat=True, unset="none"),
    Option("cpu_moe", "model", "every block's routed experts on the CPU; attention, shared weights and the KV stay "
           "on the GPU", _boolean, False, flags=("-cmoe", "--cpu-moe"), fields=(_MOD,)),
    Option("n_cpu_moe", "model", "the routed experts of the first N blocks on the CPU", _integer, 0,
           flags=("-ncmoe", "--n-cpu-moe"), minimum=0, fields=(_MOD,), metavar="N"),
    Option("moe_gpu_budget_mb", "model", "MiB of GPU memory for the weights: the experts of the first blocks move "
           "to the CPU until the rest fits (0: the free memory less 1 GiB, when they would not fit; -1: off)",
           _integer, 0, flags=("--moe-gpu-budget",), minimum=-1, fields=(_MOD,), metavar="MIB"),
    Option("verbose", "model", "print a load summary to stderr", _boolean, False, {LLAMA: True},
           flags=("-v", "--verbose")),
    # ---- context ----
    Option("n_ctx", "context", "tokens of context per sequence, prompt + generated (0: the model's training "
           "context)", _integer, 512, _ENGINE_FRONT_ENDS, flags=("-c", "--ctx-size"), minimum=0,
           fields=(_CTX, _ENG), metavar="N"),
    Option("n_batch", "context", "prompt tokens per forward", _integer, 512, {PERPLEXITY: None},
           flags=("-b", "--batch-size"), minimum=1, fields=(_CTX,), metavar="N", unset="n_ctx"),
    Option("n_threads", "context", "CPU threads (0: all cores)", _integer, None, flags=("-t", "--threads"),
           minimum=0, unset="all cores", fields=(_CTX, _ENG), metavar="N"),
    Option("kv_block_size", "context", "tokens per paged-KV block", _integer, 16, minimum=1, fields=(_CTX, _ENG)),
    Option("state_snapshot_interval", "context", "hybrid models (recurrent layers): keep the sequence's recurrent "
           "state every N tokens, so a prompt sharing a prefix resumes from the last copy in it (0: never)",
           _integer, 128, minimum=0, fields=(_CTX, _ENG), flags=("--state-snapshot-interval",), metavar="N"),
    Option("state_snapshot_mb", "context", "host memory the recurrent state copies may take (the oldest dropped "
           "first)", _integer, 1024, minimum=0, fields=(_CTX, _ENG), flags=("--state-snapshot-mb",), metavar="MiB"),
    Option("embedding", "context", "keep hidden states for embeddings instead of logits (no completions); "
           "ember-server: serve embeddings and ranks only", _boolean, False, flags=("--embedding", "--embeddings"),
           fields=(_CTX,), field="embeddings"),
    Option("pooling_type", "context", "pooling of embeddings: 0 none, 1 mean, 2 cls, 3 last, 4 rank (scores of "
           "(query, document) pairs) (-1: the GGUF's {arch}.pooling_type)", _integer, POOLING_UNSPECIFIED,
           minimum=-1, maximum=4),
    Option("logits_all", "context", "keep the logits of every evaluated token (Llama.scores, eval_logits), not only "
           "the last one's", _boolean, False),
    Option("chat_format", "context", "the chat prompt format of create_chat_completion: chatml, llama-2, llama-3, "
           "mistral-instruct, gemma, qwen, zephyr, vicuna", unset="the GGUF's tokenizer.chat_template"),
    Option("last_n_tokens_size", "context", "recent tokens the repeat penalty looks at", _integer, 64, minimum=0),
    # ---- KV cache ----
    Option("type_k", "KV cache", "KV cache type of K", kv_type, "f16", flags=("-ctk", "--cache-type-k"),
           choices=KV_CACHE_TYPES, fields=(_CTX, _ENG)),
    Option("type_v", "KV cache", "KV cache type of V (whatever K's is)", kv_type, "f16",
           flags=("-ctv", "--cache-type-v"), choices=KV_CACHE_TYPES, fields=(_CTX, _ENG)),
    Option("offload_kqv", "KV cache", "keep the KV of GPU blocks on the GPU (-nkvo: in host memory; docs/cuda.md)",
           _boolean, True, flags=("-kvo", "--kv-offload"), negative=("-nkvo", "--no-kv-offload"),
           fields=(_CTX, _ENG)),
    Option("kv_gpu_cache_mb", "KV cache", "with -nkvo: MiB of GPU memory that keep copies of the host KV blocks "
           "each step reads (0: none)", _integer, 1024, flags=("--kv-gpu-cache-mb",), minimum=0,
           fields=(_CTX, _ENG), metavar="MIB"),
    Option("kv_mb", "KV cache", "MiB of KV cache shared by all sequences (0: room for max_num_seqs full "
           "sequences, at most 4 GiB)", _number, 0.0, flags=("--kv-mb",), minimum=0, fields=(_ENG,), metavar="MIB"),
    Option("kv_host_mb", "KV cache", "MiB of host memory for the KV host tier: preempted sequences swap out to it "
           "and evicted prefix-cache blocks stay in it (0: none; docs/engine.md)", _number, 0.0,
           flags=("--kv-host-mb",), minimum=0, fields=(_ENG,), metavar="MIB"),
    Option("kv_cache_dtype", "KV cache", "vLLM's name for the KV cache type: auto (type_k / type_v), fp16, "
           "bfloat16, float32 or q8_0", default="auto", flags=("--kv-cache-dtype",)),
    Option("swap_space", "KV cache", "GiB of host memory for the KV host tier (vLLM's name; kv_host_mb in GiB)",
           _number, None, flags=("--swap-space",), minimum=0, metavar="GIB", unset="kv_host_mb"),
    Option("gpu_memory_utilization", "KV cache", "share of the GPU's memory this process may fill: with blocks on "
           "the GPU and no kv_mb, the KV pool takes what the weights leave of it (docs/engine.md)", _number, None,
           {SERVER: 0.9}, flags=("--gpu-memory-utilization",), minimum=0.01, maximum=1.0, metavar="FRACTION",
           unset="kv_mb's default pool"),
    # ---- engine ----
    Option("tensor_parallel_size", "engine", "GPUs one model is split over (vLLM's; ember runs one: 1)", _integer, 1,
           flags=("-tp", "--tensor-parallel-size"), minimum=1, metavar="N"),
    Option("max_num_seqs", "engine", "sequences decoded at once; more requests wait", _integer, 64,
           flags=("-np", "--max-num-seqs", "--parallel"), minimum=1, fields=(_ENG,), metavar="N"),
    Option("max_num_batched_tokens", "engine", "tokens of one forward step, prompt chunks and decodes together",
           _integer, 512, flags=("-b", "--batch-size", "--max-num-batched-tokens"), minimum=1, fields=(_ENG,),
           metavar="N"),
    Option("enable_prefix_caching", "engine", "reuse the KV of prompt prefixes that earlier requests computed",
           _boolean, True, flags=("--enable-prefix-caching",), negative=("--no-enable-prefix-caching",),
           fields=(_ENG,)),
    Option("deterministic", "engine", "a request's tokens do not depend on the rest of the batch "
           "(batch-invariant kernels; docs/engine.md)", _boolean, False, flags=("--deterministic",), fields=(_ENG,)),
    # ---- sampling ----
    Option("seed", "sampling", "RNG seed (-1: random)", _integer, None, flags=("-s", "--seed"), minimum=-1,
           unset="random"),
    Option("temperature", "sampling", "temperature (<= 0: greedy)", _number, 0.8, flags=("--temp",)),
    Option("top_k", "sampling", "keep the k most likely tokens (0: all)", _integer, 40, flags=("--top-k",),
           minimum=0),
    Option("top_p", "sampling", "keep the most likely tokens up to this probability mass", _number, 0.95,
           flags=("--top-p",), minimum=0),
    Option("min_p", "sampling", "drop tokens less likely than min_p times the most likely one", _number, 0.05,
           flags=("--min-p",), minimum=0),
    Option("repeat_penalty", "sampling", "penalty of recently seen tokens (1: none)", _number, 1.0,
           flags=("--repeat-penalty",), minimum=0),
    # ---- server ----
    Option("host", "server", "address to listen on", default="127.0.0.1", flags=("--host",)),
    Option("port", "server", "port to listen on", _integer, 8080, flags=("--port",), minimum=0),
    Option("api_key", "server", "require `Authorization: Bearer KEY`", flags=("--api-key",), env="EMBER_API_KEY",
           metavar="KEY", unset="open"),
    Option("chat_template", "server", "a Jinja chat template file, used instead of the GGUF's",
           flags=("--chat-template",), metavar="FILE", unset="the GGUF's tokenizer.chat_template"),
    Option("alias", "server", "the model id in the API", flags=("--alias",), unset="the file name"),
    Option("max_queue", "server", "requests that may wait for a slot; past that, 503", _integer, 256,
           flags=("--max-queue",), minimum=0),
    Option("pooling", "server", "pooling of /v1/embeddings (rank: the server ranks, as with --reranking)",
           flags=("--pooling",), choices=tuple(POOLING_NAMES),
           unset="the GGUF's {arch}.pooling_type, else none, which /v1/embeddings refuses as llama-server does"),
    Option("reranking", "server", "serve /v1/rerank and /score with the model's rank head only (llama-server's "
           "--reranking: --embedding with pooling rank)", _boolean, False, flags=("--reranking", "--rerank")),
    Option("tool_call_parser", "server", "the syntax replies are parsed for tool calls in: hermes (`<tool_call>` "
           "blocks), mistral (`[TOOL_CALLS]`), json (Llama 3's JSON replies)", flags=("--tool-call-parser",),
           choices=ToolCallParser.STYLES, unset="the one the chat template uses"),
    Option("reasoning_parser", "server", "how replies spell their thinking, given apart as reasoning_content: "
           "auto (as the chat template writes it), none (all content), deepseek_r1, qwen3 (`<think>`), gpt_oss "
           "(harmony channels), mistral (`[THINK]`), seed_oss, ... (vLLM's names; llama.cpp's deepseek too)",
           default="auto", flags=("--reasoning-parser", "--reasoning-format"), choices=REASONING_PARSERS),
    Option("reasoning_budget", "server", "tokens a reply may think before its thinking is closed for it (-1: no "
           "limit; 0: no thinking); a request's thinking_token_budget replaces it", _integer, -1,
           flags=("--reasoning-budget",), minimum=-1, metavar="N"),
    Option("timeout", "server", "seconds a client may take to send a request (headers and body) or to read a "
           "response before its connection closes (a stalled stream stops generating)", _number, 600.0,
           flags=("-to", "--timeout"), minimum=1, metavar="S"),
    Option("shutdown_timeout", "server", "seconds running requests may finish after SIGTERM / Ctrl-C; then streams "
           "end with finish_reason \"abort\" and waiting requests get 503 (a second signal exits at once)",
           _number, 10.0, flags=("--shutdown-timeout",), minimum=0, metavar="S"),
    Option("max_connections", "server", "open connections at most; past that, new requests get 503", _integer,
           1024, flags=("--max-connections",), minimum=1, metavar="N"),
    Option("cors_origin", "server", "web origins allowed to call the API from a browser, comma-separated (`*`: "
           "any)", flags=("--cors-origin",), metavar="ORIGINS", unset="none: browsers keep other sites' pages "
           "from reading the API"),
)

OPTIONS: Dict[str, Option] = {o.name: o for o in _OPTIONS}

# The options each front end takes. A CLI takes other flags of its own too (ember's -p, ember-bench's
# test sizes), which no other front end shares.
_LOAD = ("n_gpu_layers", "main_gpu", "use_mmap", "override_tensor", "cpu_moe", "n_cpu_moe", "moe_gpu_budget_mb")
_KV = ("type_k", "type_v", "offload_kqv", "kv_gpu_cache_mb")
_VLLM = ("dtype", "kv_cache_dtype", "swap_space", "gpu_memory_utilization", "tensor_parallel_size")
FRONT_ENDS: Dict[str, Tuple[str, ...]] = {
    LLAMA: (*_LOAD, "verbose", "n_ctx", "n_batch", "n_threads", "kv_block_size", "state_snapshot_interval",
            "state_snapshot_mb", "embedding", "pooling_type",
            "logits_all", "chat_format", "last_n_tokens_size", *_KV, "seed"),
    LLM: (*_LOAD, "verbose", "n_ctx", "n_threads", "kv_block_size", "state_snapshot_interval", "state_snapshot_mb",
          "pooling_type", *_KV, "kv_mb", "kv_host_mb",
          *_VLLM,
          "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "deterministic", "seed"),
    EMBER: ("model", *_LOAD, "verbose", "n_ctx", "n_batch", "n_threads", *_KV, "seed", "temperature", "top_k",
            "top_p", "min_p", "repeat_penalty"),
    BENCH: ("model", *_LOAD, "n_batch", "n_threads", *_KV, "deterministic"),
    PERPLEXITY: ("model", *_LOAD, "n_ctx", "n_batch", "n_threads", *_KV),
    SERVER: ("model", *_LOAD, "n_ctx", "n_threads", "state_snapshot_interval", "state_snapshot_mb", *_KV, "kv_mb",
             "kv_host_mb", *_VLLM, "max_num_seqs",
             "max_num_batched_tokens", "enable_prefix_caching", "deterministic", "host", "port", "api_key",
             "chat_template", "alias", "max_queue", "embedding", "pooling", "reranking",
             "tool_call_parser", "reasoning_parser", "reasoning_budget", "timeout", "shutdown_timeout",
             "max_connections", "cors_origin"),
    QUANTIZE: ("n_threads",),
}

# llama-cpp-python's Llama arguments that change nothing in ember (flash attention and NUMA are not
# separate modes here, mlock and the thread / batch splits have no counterpart): taken so that
# existing code ports unchanged.
IGNORED = {LLAMA: frozenset({"use_mlock", "n_threads_batch", "n_ubatch", "numa", "flash_attn"}),
           # vLLM's that do nothing here (trust_remote_code says so on stderr): a GGUF carries its own
           # tokenizer and runs no code; ember has no eager / graph switch or stats logger to turn off.
           LLM: frozenset({"trust_remote_code", "tokenizer", "enforce_eager", "disable_log_stats"})}


def kv_cache_types(type_k=None, type_v=None) -> Tuple[str, str]:
    """The K and V cache types (KV_CACHE_TYPES) that llama-cpp-python's type_k / type_v name (ggml
    type ids or those names; None: f16), each on its own."""
    return check("KV cache", "type_k", type_k) or "f16", check("KV cache", "type_v", type_v) or "f16"


def kv_cache_type(type_k=None, type_v=None) -> str:
    """The one KV cache type of tools that size or report K and V as one type (ember-bench,
    ember-perplexity): type_k and type_v as kv_cache_types reads them, which must agree there."""
    k, v = kv_cache_types(type_k, type_v)
    if k != v:
        raise ValueError(f"type_k ({k}) and type_v ({v}) must be the same KV cache type for this tool")
    return k


def context_size(model, n_ctx: int) -> int:
    """The context length n_ctx asks for (0: the model's training context), with a warning on
    stderr past the training context."""
    n_ctx_train = model.n_ctx_train
    n_ctx = n_ctx or n_ctx_train
    if n_ctx_train > 0 and n_ctx > n_ctx_train:
        print(f"ember: warning: n_ctx {n_ctx} is larger than the model's training context "
              f"(n_ctx_train {n_ctx_train}); output past {n_ctx_train} tokens may degrade", file=sys.stderr)
    return n_ctx


def default(name: str, front_end: str):
    """The option's default for that front end."""
    return OPTIONS[name].default_for(front_end)


def check(front_end: str, name: str, value):
    """value as the option holds it; ValueError naming the front end, the option and the value."""
    try:
        return OPTIONS[name].check(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{front_end}: {name} {e}, got {value!r}") from None


def resolve(front_end: str, given: Mapping[str, Any]) -> Dict[str, Any]:
    """Every option of a Python front end: given values checked, the rest at their defaults. An
    unknown keyword raises TypeError naming it; a bad value ValueError naming the option."""
    names = FRONT_ENDS[front_end]
    unknown = sorted(set(given) - set(names) - IGNORED.get(front_end, frozenset()))
    if unknown:
        raise TypeError(f"{front_end}() got unexpected keyword arguments: {', '.join(unknown)} "
                        f"(it takes {', '.join(names)}; docs/options.md)")
    # None stands for the default, as llama-cpp-python's callers pass n_threads=None or type_k=None.
    return {n: default(n, front_end) if given.get(n) is None else check(front_end, n, given[n]) for n in names}


def signature(front_end: str, init) -> inspect.Signature:
    """What help() and editors show for a Python front end's __init__(..., **kwargs): its own
    parameters, then every option of the table keyword-only with its default."""
    own = inspect.signature(init)
    kept = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    return own.replace(parameters=kept + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY,
                                                            default=default(n, front_end))
                                          for n in FRONT_ENDS[front_end]])


def fill(params, values: Mapping[str, Any], **overrides):
    """params (an _ember.ModelParams / ContextParams / EngineParams) with the fields of every option
    in values that maps to its struct; overrides are field values set last. Returns params."""
    struct = type(params).__name__
    for name, value in values.items():
        option = OPTIONS.get(name)
        if option is None or struct not in option.fields:
            continue
        if value is None:   # n_threads: all cores, which the structs spell 0; a list option: empty
            value = [] if option.repeat else 0
        setattr(params, option.field or name, value)
    for name, value in overrides.items():
        setattr(params, name, value)
    return params


def struct_defaults(params_classes: Iterable) -> Dict[Tuple[str, str], Any]:
    """{(struct, field): default} of default-constructed params classes, for the fields options set."""
    out = {}
    for cls in params_classes:
        made = cls()
        for option in _OPTIONS:
            if cls.__name__ in option.fields:
                out[cls.__name__, option.field or option.name] = getattr(made, option.field or option.name)
    return out


# ---- command lines ------------------------------------------------------------------------------
class _Extend(argparse.Action):
    """A repeatable option's flag: each use adds its (already parsed) list to the earlier ones."""

    def __call__(self, parser, namespace, given, option_string=None):
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), *given])


class _Switch(argparse.Action):
    """A bool option's flag: alone it sets True (a negative flag False); its own flags take an
    optional 0/1 too (`-mmp 0`, as llama-bench spells it)."""

    def __init__(self, option_strings, dest, value=True, **kw):
        self.value = value
        super().__init__(option_strings, dest, nargs="?" if value else 0, **kw)

    def __call__(self, parser, namespace, given, option_string=None):
        setattr(namespace, self.dest, given if self.value and given is not None else self.value)


def _cli_type(option: Option, front_end: str):
    def parse(text: str):
        if option.choices is not None and text not in map(str, option.choices):
            return text   # argparse's "invalid choice" message lists them
        try:
            return option.check(text)
        except (TypeError, ValueError) as e:
            raise argparse.ArgumentTypeError(f"{e}, got {text!r}") from None
    parse.__name__ = option.type.__name__.lstrip("_")   # argparse names it in "invalid ... value"
    return parse


def _cli_default(option: Option, front_end: str):
    if option.env and os.environ.get(option.env):
        return option.check(os.environ[option.env])
    return option.default_for(front_end)


def _help(option: Option, front_end: str) -> str:
    text = option.help
    value = option.default_for(front_end)
    if option.env:
        text += f" (default: ${option.env}, else {option.unset})"
    elif value is None and option.unset:
        text += f" (default: {option.unset})"
    elif value is not None and not option.required:
        shown = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
        text += f" (default: {shown})"
    return text.replace("%", "%%")


def add_arguments(parser: argparse.ArgumentParser, front_end: str, names: Optional[Iterable[str]] = None) -> None:
    """Adds the front end's options (or those of names) that have flags to parser, grouped by
    section; each lands in args.<option name>."""
    groups: Dict[str, Any] = {}
    for name in names or FRONT_ENDS[front_end]:
        option = OPTIONS[name]
        if not option.flags:
            continue
        group = groups.get(option.section)
        if group is None:
            group = groups[option.section] = parser.add_argument_group(option.section)
        default_value = _cli_default(option, front_end)
        if option.type is _boolean:
            group.add_argument(*option.flags, dest=name, action=_Switch, type=_cli_type(option, front_end),
                               default=default_value, metavar="0|1", help=_help(option, front_end))
            if option.negative:
                group.add_argument(*option.negative, dest=name, action=_Switch, value=False,
                                   default=default_value, help=f"the same as {option.flags[-1]} 0")
            continue
        extra = {"choices": option.choices} if option.choices else {}
        if option.repeat:
            extra["action"] = _Extend
        group.add_argument(*option.flags, dest=name, type=_cli_type(option, front_end), default=default_value,
                           required=option.required, metavar=option.metavar or (None if extra else name.upper()),
                           help=_help(option, front_end), **extra)


def values(args: argparse.Namespace, front_end: str) -> Dict[str, Any]:
    """The options of a front end (LLAMA or LLM) that args holds, as keyword arguments for it."""
    return {n: getattr(args, n) for n in FRONT_ENDS[front_end] if hasattr(args, n)}
