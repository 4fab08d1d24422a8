// moe_ffn_remote: the copies around experts that run apart from their block; ExpertStream: their
// staging on the GPU for large batches.
#include "model/remote_experts.h"

#include <cstdio>

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

std::unique_ptr<ExpertStream> ExpertStream::open(Backend& gpu, const std::vector<RemoteExperts>& remote,
                                                 HostParallelFor parallel_for, bool verbose) {
    StreamSetup su;
    su.blocks.resize(remote.size());
    std::vector<std::vector<int>> roles(remote.size());
    for (size_t l = 0; l < remote.size(); ++l) {
        if (!remote[l].be) continue;
        for (int r = 0; r < kRoles; ++r)
            if (remote[l].w.mat[r].data) {
                su.blocks[l].push_back(remote[l].w.mat[r]);
                roles[l].push_back(r);
            }
    }
    su.parallel_for = std::move(parallel_for);
    su.verbose = verbose;
    try {
        std::unique_ptr<WeightStream> ws = gpu.open_stream(su);
        if (!ws) return nullptr;
        std::unique_ptr<ExpertStream> es(new ExpertStream(std::move(ws)));
        es->roles_ = std::move(roles);
        return es;
    } catch (const std::exception& e) {
        if (verbose)
            std::fprintf(stderr, "ember: prompt batches run the CPU experts on the CPU (no GPU staging: %s)\n",
                         e.what());
        return nullptr;
    }
}

BlockWeights ExpertStream::begin_block(int32_t l, const BlockWeights& gpu_w) {
    if (staged_.empty()) staged_ = stream_->upload(l % 2, l);
    BlockWeights w = gpu_w;
    for (size_t i = 0; i < roles_[l].size(); ++i) w.mat[roles_[l][i]] = staged_[i];
    staged_.clear();
    stream_->acquire(l % 2);
    return w;
}

void ExpertStream::end_block(int32_t l, int32_t next) {
    stream_->release(l % 2);
    if (next >= 0) staged_ = stream_->upload(next % 2, next);
}

}  // namespace ember
