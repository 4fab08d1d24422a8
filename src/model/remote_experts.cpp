// moe_ffn_remote: the copies around experts that run apart from their block.
#include "model/remote_experts.h"

namespace ember {

void moe_ffn_remote(const BlockRun& r, const MoeWeights& m, const float* residual, float* out) {
    const RemoteExperts& e = *r.experts;
    const size_t bytes = (size_t)r.n_tok * r.hp.n_embd * sizeof(float);
    if (residual) r.be.add(r.x, residual, (int64_t)r.n_tok * r.hp.n_embd);
    // copy_to_host returns once the block's ops before it are done and x has landed, so the CPU
    // reads a finished hidden state; the copy back is ordered before the block's next ops.
    r.be.copy_to_host(e.x, r.x, bytes);
    e.be->moe_ffn(m, e.x, nullptr, r.n_tok, *e.buf, e.out);
    r.be.copy_from_host(out, e.out, bytes);
}

}  // namespace ember
