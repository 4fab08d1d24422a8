// Streaming host-resident blocks' weights into device staging memory (WeightStream of
// backend/backend.h): raw ggml blocks are copied on a second stream (from the pinned mapping, or
// through pinned bounce buffers) and re-laid out on the GPU into weight_pack.h's layout.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <memory>

#include "backend/backend.h"

namespace ember {
namespace cuda {

// compute: the backend's stream; flush: issues the backend's pending input uploads, so anything
// ordered on `compute` comes after every op and copy issued before it. pin: the backend's
// EMBER_STREAM_PIN (false: copies go through the bounce buffers even where the mapping could be pinned).
std::unique_ptr<WeightStream> open_weight_stream(int device, cudaStream_t compute, std::function<void()> flush,
                                                 const StreamSetup& setup, bool pin);

// raw: n_out rows of ggml blocks in device memory -> dst in the packed layout (types with
// PackedLayout::qs_bytes > 0); the same bytes as pack_weight on the host.
void pack_weight_device(GGMLType type, int64_t n_in, int64_t n_out, const uint8_t* raw, uint8_t* dst, cudaStream_t s);

}  // namespace cuda
}  // namespace ember
