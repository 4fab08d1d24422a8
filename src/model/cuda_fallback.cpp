// make_cuda_backend for builds without CUDA: asking for GPU layers is a clear error.
#include "ember/status.h"
#include "model/backend.h"

#ifndef EMBER_HAS_CUDA
namespace ember {
std::unique_ptr<Backend> make_cuda_backend(int device) {
    fail("n_gpu_layers > 0 needs the CUDA backend, but this ember was built without it "
         "(rebuild with -Ccmake.define.EMBER_CUDA=ON); device ", device, " not available");
}
}  // namespace ember
#endif
