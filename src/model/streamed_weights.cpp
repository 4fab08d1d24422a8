// StreamedWeights: weight staging sets, KV staging and the copies around each streamed block.
#include "model/streamed_weights.h"

#include <cstdio>

#include "backend/kv_copy.h"

namespace ember {

std::unique_ptr<StreamedWeights> StreamedWeights::open(ModelImpl& m, const std::vector<BlockWeights>& cpu_blocks,
                                                       Backend& cpu, const KVLayer& kv) {
    StreamSetup su;
    su.blocks.resize(cpu_blocks.size());
    std::vector<std::vector<int>> roles(cpu_blocks.size());
    for (size_t l = 0; l < cpu_blocks.size(); ++l) {
        if (m.plan.block[l] != Device::cpu) continue;
        for (int r = 0; r < kRoles; ++r)
            if (cpu_blocks[l].mat[r].data) {
                su.blocks[l].push_back(cpu_blocks[l].mat[r]);
                roles[l].push_back(r);
            }
    }
    su.parallel_for = cpu.host_parallel_for();
    su.verbose = m.params.verbose;
    try {
        std::unique_ptr<WeightStream> ws = m.gpu->open_stream(su);
        if (!ws) return nullptr;
        std::unique_ptr<StreamedWeights> so(new StreamedWeights(m, std::move(ws)));
        so->roles_ = std::move(roles);
        const int64_t width = (int64_t)kv.n_head_kv * kv.head_dim;
        const size_t k_bytes = (size_t)kv.n_blocks * kv_block_bytes(kv.k_type, kv.block_size, width);
        const size_t v_bytes = (size_t)kv.n_blocks * kv_block_bytes(kv.v_type, kv.block_size, width);
        so->kv_mem_ = m.gpu->alloc(k_bytes + v_bytes);
        so->kv_ = kv;
        so->kv_.k = so->kv_mem_;
        so->kv_.v = static_cast<uint8_t*>(so->kv_mem_) + k_bytes;
        return so;
    } catch (const std::exception& e) {
        if (m.params.verbose)
            std::fprintf(stderr, "ember: prompt batches run the CPU blocks on the CPU (no GPU staging: %s)\n",
                         e.what());
        return nullptr;
    }
}

StreamedWeights::~StreamedWeights() {
    if (kv_mem_) m_.gpu->free(kv_mem_);
}

BlockWeights StreamedWeights::begin_block(int32_t l, const KVLayer& cpu_kv, const std::vector<int32_t>& ids,
                                          int32_t n_past) {
    if (staged_.empty()) staged_ = stream_->upload(l % 2, l);
    BlockWeights w = m_.stream_blocks[l];
    for (size_t i = 0; i < roles_[l].size(); ++i) w.mat[roles_[l][i]] = staged_[i];
    staged_.clear();
    stream_->acquire(l % 2);
    const int32_t bs = cpu_kv.block_size;
    copy_blocks(cpu_kv, kv_, ids, 0, (n_past + bs - 1) / bs, true);
    return w;
}

void StreamedWeights::end_block(int32_t l, KVLayer& cpu_kv, const std::vector<int32_t>& ids, int32_t n_past,
                                int32_t n_tok, bool next_streamed) {
    const int32_t bs = cpu_kv.block_size;
    copy_blocks(kv_, cpu_kv, ids, n_past / bs, (n_past + n_tok - 1) / bs + 1, false);
    stream_->release(l % 2);
    if (next_streamed) staged_ = stream_->upload((l + 1) % 2, l + 1);
}

void StreamedWeights::copy_blocks(const KVLayer& from, KVLayer& to, const std::vector<int32_t>& ids, int32_t b0,
                                  int32_t b1, bool to_gpu) {
    if (b1 <= b0) return;
    copy_kv_block_runs(from, to, ids.data() + b0, size_t(b1 - b0), [&](void* dst, const void* src, size_t bytes) {
        if (to_gpu) m_.gpu->copy_from_host(dst, src, bytes);
        else stream_->copy_to_host_async(dst, src, bytes);
    });
}

}  // namespace ember
