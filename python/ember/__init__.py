"""ember: a llama.cpp-style LLM inference runtime (GGUF models on CPU and CUDA)."""
import os as _os

# Development builds: EMBER_DEV_BUILD names a CMake build folder holding _ember*.so.
if _os.environ.get("EMBER_DEV_BUILD"):
    __path__.append(_os.environ["EMBER_DEV_BUILD"])

from . import _ember  # noqa: E402
from .llama import Llama  # noqa: E402
from .sampling_params import SamplingParams  # noqa: E402
from .structured import LlamaGrammar, StructuredOutputsParams  # noqa: E402
from .outputs import CompletionOutput, Logprob, RequestOutput  # noqa: E402
from .llm import LLM  # noqa: E402
from .async_engine import AsyncLLMEngine  # noqa: E402
from .engine_args import AsyncEngineArgs, EngineArgs  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = ["Llama", "LLM", "AsyncLLMEngine", "AsyncEngineArgs", "EngineArgs", "SamplingParams", "RequestOutput",
           "CompletionOutput", "Logprob", "StructuredOutputsParams", "LlamaGrammar", "_ember", "__version__"]
