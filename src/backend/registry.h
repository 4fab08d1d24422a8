// Backends by name ("cpu", "cuda"): the model layer asks for a device here and never names a
// backend's own factory. The list of backends built in comes from CMake (backends.inc).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/switches.h"

namespace ember {

struct BackendOptions {
    int n_threads = 1;   // host threads (the CPU backend's pool)
    int device = 0;      // device index (GPU backends)
    // The EMBER_* switch values the backend reads, once, when it is made (its kernels' choices
    // included): a later set_switch or environment change does not reach a live backend.
    Switches switches = Switches::current();
};

// Throws InvalidInput naming the backend when it is not built in or cannot start (no device).
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& opts);
// Whether `name` was built into this ember.
bool backend_built(const std::string& name);
// The names built in, in registry order.
std::vector<std::string> backend_names();

}  // namespace ember
