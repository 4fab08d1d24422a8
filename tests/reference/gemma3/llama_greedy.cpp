// Greedy continuation with llama.cpp's C API that records what llama-completion's text alone
// cannot: the prompt's and the continuation's token ids, and at each step the gap between the top
// two logits (how close the pick was). Used to make greedy.jsonl (see README.md); not part of ember.
//
//   g++ -O2 -std=c++17 llama_greedy.cpp -I$LCPP/include -I$LCPP/ggml/include -L$LCPP/build/bin \
//       -lllama -lggml -lggml-base -Wl,-rpath,$LCPP/build/bin -o llama-greedy
//   llama-greedy MODEL N_PREDICT N_CTX N_THREADS PROMPT [FLASH_ATTN: auto (default), on, off]
//
// Prints one line: prompt ids, continuation ids, top-two gaps, and the continuation's bytes as hex.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "llama.h"

static void print_ids(const char* name, const std::vector<llama_token>& ids) {
    std::printf("%s", name);
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? "," : "", ids[i]);
    std::printf("\n");
}

int main(int argc, char** argv) {
    if (argc != 6 && argc != 7) {
        std::fprintf(stderr, "usage: %s MODEL N_PREDICT N_CTX N_THREADS PROMPT [auto|on|off]\n", argv[0]);
        return 2;
    }
    const int n_predict = std::atoi(argv[2]), n_ctx = std::atoi(argv[3]), n_threads = std::atoi(argv[4]);
    const std::string prompt = argv[5];

    llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model* model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const llama_vocab* vocab = llama_model_get_vocab(model);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_threads = cp.n_threads_batch = n_threads;
    // Another valid arithmetic (flash attention off) measures how far llama.cpp moves on its own.
    if (argc == 7) {
        const std::string fa = argv[6];
        cp.flash_attn_type = fa == "on"    ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                             : fa == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                           : LLAMA_FLASH_ATTN_TYPE_AUTO;
    }
    llama_context* ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;

    // As llama-completion tokenizes a prompt: the model's BOS, special tokens parsed.
    std::vector<llama_token> prompt_ids(prompt.size() + 8);
    const int n = llama_tokenize(vocab, prompt.data(), int32_t(prompt.size()), prompt_ids.data(),
                                 int32_t(prompt_ids.size()), llama_vocab_get_add_bos(vocab), true);
    if (n < 0) return 1;
    prompt_ids.resize(n);

    const int n_vocab = llama_vocab_n_tokens(vocab);
    std::vector<llama_token> out;
    std::vector<float> gaps;
    std::string text;
    std::vector<llama_token> next = prompt_ids;
    for (int step = 0; step < n_predict; ++step) {
        if (llama_decode(ctx, llama_batch_get_one(next.data(), int32_t(next.size()))) != 0) return 1;
        const float* logits = llama_get_logits_ith(ctx, -1);
        int best = 0, second = -1;
        for (int t = 1; t < n_vocab; ++t) {
            if (logits[t] > logits[best]) {
                second = best;
                best = t;
            } else if (second < 0 || logits[t] > logits[second]) {
                second = t;
            }
        }
        out.push_back(best);
        gaps.push_back(logits[best] - logits[second]);
        if (llama_vocab_is_eog(vocab, best)) break;
        char piece[256];
        const int len = llama_token_to_piece(vocab, best, piece, sizeof piece, 0, false);
        if (len > 0) text.append(piece, len);
        next.assign(1, best);
    }

    print_ids("prompt_ids ", prompt_ids);
    print_ids("ids ", out);
    std::printf("gaps ");
    for (size_t i = 0; i < gaps.size(); ++i) std::printf("%s%.5f", i ? "," : "", gaps[i]);
    std::printf("\ntext ");
    for (unsigned char c : text) std::printf("%02x", c);
    std::printf("\n");
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
