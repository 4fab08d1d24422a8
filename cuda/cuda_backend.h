// The CUDA backend's factory. The registry (src/backend/registry.cpp) reaches it by name through
// backends.inc; the kernel bench links it directly.
#pragma once
#include <memory>

#include "backend/backend.h"
#include "backend/registry.h"

namespace ember {

// Throws InvalidInput when no CUDA device is present or opts.device does not exist.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts);

}  // namespace ember
