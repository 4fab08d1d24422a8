"""The `ember` command: load a GGUF model and stream a completion of a prompt to stdout
(ember -m MODEL -p PROMPT -n N [--temp T] [--seed S] [-c N_CTX] [-t THREADS] [-ngl N] [-ctk/-ctv TYPE]);
the options shared with the other tools are docs/options.md's."""
from __future__ import annotations

import argparse
import signal
import sys
from typing import Callable, List, Optional

from . import options
from .llama import Llama


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
    p.add_argument("-p", "--prompt", required=True, help="the prompt text")
    p.add_argument("-n", "--n-predict", type=int, default=128,
                   help="tokens to generate (<= 0: until end of generation or a full context)")
    p.add_argument("--echo", action="store_true", help="print the prompt before the completion")
    options.add_arguments(p, options.EMBER)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    return run_tool("ember", lambda: _complete(args))


def _complete(args) -> int:
    with Llama(args.model, **options.values(args, options.LLAMA)) as llm:
        chunks = llm.create_completion(args.prompt, max_tokens=args.n_predict, temperature=args.temperature,
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
