// The CUDA backend's decode-step graphs: a step is keyed by the caller's key, the batch shape and
// the attention split; its first run goes eagerly (sizing every scratch buffer), its second is
// captured, later ones replay the graph. A step whose first run waited on the host (an op composed
// through host round trips) is never captured. A buffer that moves invalidates every recorded step.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cuda_backend_impl.h"
#include "cuda_check.h"

namespace ember {
namespace cuda {

// The step's pending uploads (batch mirror, first hidden state) are part of the key: a recorded
// step holds them as its first nodes, reading the same pinned staging each replay.
bool CudaBackend::step_begin(uint64_t key) {
    if (capturing_) abort_capture();
    eager_step_ = host_waited_ = false;
    if (!step_is_graphed(BatchFacts{n_tok_, decode_batch(), invariant_}, sw_)) return false;
    uint64_t full = mix(mix(key, batch_sig_), graph_gen_);
    for (int i = 0; i < uploads_.n; ++i)
        full = mix(
            mix(mix(full, reinterpret_cast<uintptr_t>(uploads_.dst[i])), reinterpret_cast<uintptr_t>(uploads_.src[i])),
            uploads_.bytes[i]);
    auto it = graphs_.find(full);
    if (sw_.graph_log)
        std::fprintf(stderr, "ember cuda graph: key %016llx gen %llu n_tok %d: %s\n", (unsigned long long)full,
                     (unsigned long long)graph_gen_, n_tok_,
                     it != graphs_.end()       ? "replay"
                     : host_bound_.count(full) ? "eager (it waits on the host)"
                     : seen_.count(full)       ? "capture"
                                               : "eager (first sight)");
    if (it != graphs_.end()) {
        uploads_.n = 0;
        launch_graph(it->second);
        return true;
    }
    if (host_bound_.count(full)) return false;
    if (seen_.size() >= kMaxStepKeys) {
        for (auto& g : graphs_) cudaGraphExecDestroy(g.second);
        graphs_.clear();
        seen_.clear();
        host_bound_.clear();
    }
    if (seen_.insert(full).second) {   // first sight: eager, watching for waits on the host
        eager_step_ = true;
        eager_key_ = full;
    } else {
        EMBER_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        capturing_ = true;
        capture_key_ = full;
        capture_gen_ = graph_gen_;
        issue_uploads();
    }
    return false;
}

void CudaBackend::step_end() {
    issue_uploads();
    if (eager_step_ && host_waited_) host_bound_.insert(eager_key_);
    eager_step_ = host_waited_ = false;
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t g = nullptr;
    EMBER_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    if (capture_gen_ != graph_gen_) {   // a buffer moved during the step: run it, keep nothing
        cudaGraphExec_t once = nullptr;
        const cudaError_t e = cudaGraphInstantiate(&once, g, 0);
        cudaGraphDestroy(g);
        EMBER_CUDA_CHECK(e);
        launch_graph(once);
        EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
        cudaGraphExecDestroy(once);
        return;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    EMBER_CUDA_CHECK(e);
    graphs_[capture_key_] = exec;
    launch_graph(exec);
}

void CudaBackend::step_abort() {
    uploads_.n = 0;
    eager_step_ = host_waited_ = false;
    if (capturing_) abort_capture();
}

void CudaBackend::launch_graph(cudaGraphExec_t g) {
    EMBER_CUDA_CHECK(cudaGraphLaunch(g, stream_));
    EMBER_CUDA_CHECK(cudaEventRecord(staging_done_, stream_));
}

void CudaBackend::invalidate_graphs() {
    if (sw_.graph_log)
        std::fprintf(stderr, "ember cuda graph: invalidated (gen %llu)\n", (unsigned long long)graph_gen_);
    ++graph_gen_;
    for (auto& g : graphs_) cudaGraphExecDestroy(g.second);
    graphs_.clear();
    seen_.clear();
    host_bound_.clear();
}

void CudaBackend::abort_capture() {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    capturing_ = false;
}

}  // namespace cuda
}  // namespace ember
