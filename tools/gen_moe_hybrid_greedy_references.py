"""Writes tests/reference/moe_hybrid/llama_cpp_greedy.json: llama.cpp's greedy text (llama-simple, CPU, its
default f16 KV cache) on the tiny mixture-of-experts, hybrid and latent-attention models of tests/hf_tiny.py,
converted by ember-convert to f32, so that tests/test_greedy_llama_cpp.py checks ember's greedy text against
llama.cpp's without llama.cpp. Where llama.cpp computes something else than transformers on purpose-built
configs (DIFFERS), the entry keeps the bytes both agree on and the reason.

    PYTHONPATH=python:tests EMBER_DEV_BUILD=build/dev python tools/gen_moe_hybrid_greedy_references.py \\
        --llama-simple /path/to/llama.cpp/build/bin/llama-simple"""
import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
import hf_tiny  # noqa: E402
from gen_chat_greedy_references import N_PREDICT, PROMPT, reference_table, write_table  # noqa: E402

OUT = ROOT / "tests" / "reference" / "moe_hybrid" / "llama_cpp_greedy.json"
MODELS = ["qwen3moe", "mixtral", "gpt-oss", "qwen35", "qwen35moe", "qwen3next", "lfm2", "lfm2-untied", "lfm2moe",
          "nemotron_h", "nemotron_h_moe", "granitehybrid", "granitehybrid-moe", "deepseek-v2", "deepseek-v3",
          "glm-4.7-flash", "qwen3moe-unnormed"]
# Configs on which llama.cpp departs from transformers (which ember follows to 1e-4): why.
DIFFERS = {
    "gpt-oss": "llama.cpp rounds YaRN's correction range (ggml_rope_yarn_corr_dims); gpt-oss's reference and "
               "transformers (rope truncate=false) do not (ember built with the range rounded gives llama.cpp's "
               "text)",
    "qwen3moe-unnormed": "llama.cpp's qwen3moe always renormalizes the chosen experts' weights; this config "
                         "sets norm_topk_prob=false",
}


def agreement(name, path, text):
    """For the DIFFERS configs: how many leading bytes ember's greedy text shares with llama.cpp's, and why."""
    if name not in DIFFERS:
        return {}
    ours = hf_tiny.greedy_bytes(str(path), PROMPT, N_PREDICT)
    agree = next((i for i, (a, b) in enumerate(zip(ours, text)) if a != b), min(len(ours), len(text)))
    return {"agree_bytes": agree, "why": DIFFERS[name]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-simple", required=True, help="llama.cpp's llama-simple binary")
    args = parser.parse_args(argv)
    write_table(reference_table(args.llama_simple, MODELS, agreement), OUT)


if __name__ == "__main__":
    main()
