"""The `ember` command: load a GGUF model and stream a completion of a prompt to stdout
(ember -m MODEL -p PROMPT -n N [--temp T] [--seed S] [-c N_CTX] [-t THREADS] [-ngl N] [-ctk/-ctv TYPE])."""
from __future__ import annotations

import argparse
import signal
import sys
from typing import Callable, List, Optional

from .llama import Llama, add_kv_cache_args


def _describe(e: BaseException) -> str:
    """An exception as the one line after `NAME: error: `."""
    if isinstance(e, MemoryError):
        return f"out of memory ({e})" if str(e) else "out of memory"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    text = " ".join(str(e).split())
    if text and (isinstance(e, (ValueError, RuntimeError, OSError)) or type(e).__module__.startswith("ember.")):
        return text
    # Anything else (TypeError, KeyError...): the message alone would not say what it is.
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def run_tool(prog: str, body: Callable[[], int]) -> int:
    """How every ember command ends: body's status; 1 with one line `PROG: error: ...` on stderr
    for any failure (never a traceback); 130 on Ctrl-C. When the reader of stdout goes away
    (`ember ... | head`) the process dies of SIGPIPE, silently, as cat or grep do: the shell
    reports 141, so `set -o pipefail` still sees that the output was cut short."""
    try:
        return body()
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.raise_signal(signal.SIGPIPE)
        raise   # reached only where SIGPIPE is blocked, so its default action could not end the process
    except Exception as e:
        print(f"{prog}: error: {_describe(e)}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ember", description="Complete a prompt with a GGUF model.")
    p.add_argument("-m", "--model", required=True, help="path of the GGUF model file")
    p.add_argument("-p", "--prompt", required=True, help="the prompt text")
    p.add_argument("-n", "--n-predict", type=int, default=128,
                   help="tokens to generate (<= 0: until end of generation or a full context)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature (<= 0: greedy)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=-1, help="RNG seed (-1: random)")
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="context size (0: the model's)")
    p.add_argument("-b", "--batch-size", type=int, default=512, help="prompt tokens per forward")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="blocks on the GPU (-1: all)")
    add_kv_cache_args(p)
    p.add_argument("--echo", action="store_true", help="print the prompt before the completion")
    p.add_argument("-v", "--verbose", action="store_true", help="print a load summary to stderr")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    return run_tool("ember", lambda: _complete(args))


def _complete(args) -> int:
    llm = Llama(args.model, n_ctx=args.ctx_size, n_batch=args.batch_size, n_threads=args.threads,
                n_gpu_layers=args.n_gpu_layers, seed=args.seed, verbose=args.verbose,
                type_k=args.cache_type_k, type_v=args.cache_type_v, offload_kqv=not args.no_kv_offload,
                kv_gpu_cache_mb=args.kv_gpu_cache_mb)
    with llm:
        chunks = llm.create_completion(args.prompt, max_tokens=args.n_predict, temperature=args.temp,
                                       top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                                       repeat_penalty=args.repeat_penalty, echo=args.echo, stream=True)
        for chunk in chunks:
            sys.stdout.write(chunk["choices"][0]["text"])
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
