// The registry's table: one row per backend built in (backends.inc, written by CMake), each a
// factory the backend's own library defines.
#include "backend/registry.h"

#include "ember/status.h"

namespace ember {

#define EMBER_BACKEND(name) std::unique_ptr<Backend> make_##name##_backend(const BackendOptions& opts);
#include "backends.inc"
#undef EMBER_BACKEND

namespace {
struct Entry {
    const char* name;
    std::unique_ptr<Backend> (*make)(const BackendOptions&);
};
const Entry kBackends[] = {
#define EMBER_BACKEND(name) {#name, &make_##name##_backend},
#include "backends.inc"
#undef EMBER_BACKEND
};
}  // namespace

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& opts) {
    for (const Entry& e : kBackends)
        if (name == e.name) return e.make(opts);
    std::string built;
    for (const Entry& e : kBackends) built += (built.empty() ? "" : ", ") + std::string(e.name);
    if (name == "cuda")
        fail(
            "n_gpu_layers != 0 needs the CUDA backend, but this ember was built without it "
            "(rebuild with -Ccmake.define.EMBER_CUDA=ON; built in: ",
            built, ")");
    fail("backend '", name, "' is not built into this ember (built in: ", built, ")");
}

bool backend_built(const std::string& name) {
    for (const Entry& e : kBackends)
        if (name == e.name) return true;
    return false;
}

std::vector<std::string> backend_names() {
    std::vector<std::string> names;
    for (const Entry& e : kBackends) names.emplace_back(e.name);
    return names;
}

}  // namespace ember
