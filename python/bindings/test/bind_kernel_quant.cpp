// The CPU quant kernels on numpy arrays: dequantize / quantize rows (scalar reference or the best
// activation quantizer), vec_dot (best or scalar reference kernel), vec_dot_type, simd_level.
// Bad type ids, impl names or lengths -> ValueError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <string>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "ember/quant.h"
#include "ember/status.h"

namespace nb = nanobind;
using namespace ember;

namespace {

// The level a backend made now would use (EMBER_SIMD through ember.switches or the environment),
// so a test picks a level in-process.
SimdLevel level_now() { return simd_level(Switches::current()); }

using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Floats = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

const TypeTraits& traits_of(uint32_t type_id) {
    const TypeTraits* t = find_type_traits(type_id);
    if (!t) fail("quant: unknown or unsupported ggml type id ", type_id);
    return *t;
}

bool use_ref(const char* fn, const std::string& impl) {
    if (impl != "ref" && impl != "best") fail(fn, ": impl must be 'ref' or 'best', got '", impl, "'");
    return impl == "ref";
}

template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> owned_array(size_t n, T*& data) {
    data = new T[n > 0 ? n : 1];
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
    return nb::ndarray<nb::numpy, T, nb::ndim<1>>(data, {n}, owner);
}

nb::ndarray<nb::numpy, float, nb::ndim<1>> dequantize(uint32_t type_id, Bytes data, int64_t n) {
    const TypeTraits& t = traits_of(type_id);
    const size_t need = row_bytes(t.type, n);
    if (data.size() != need) {
        fail("quant.dequantize: ", n, " ", t.name, " elements need ", need, " bytes, data has ", data.size());
    }
    float* out;
    auto arr = owned_array<float>(size_t(n), out);
    t.dequantize_row(data.data(), out, n);
    return arr;
}

nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> quantize(uint32_t type_id, Floats x, const std::string& impl) {
    const TypeTraits& t = traits_of(type_id);
    const bool ref = use_ref("quant.quantize", impl);
    if (!t.quantize_row) fail("quant.quantize: no quantizer for type ", t.name);
    const int64_t n = int64_t(x.size());
    const size_t bytes = row_bytes(t.type, n);
    uint8_t* out;
    auto arr = owned_array<uint8_t>(bytes, out);
    (ref ? t.quantize_row : cpu_kernels(t.type, level_now()).quantize_row_best)(x.data(), out, n);
    return arr;
}

float vec_dot(uint32_t type_id, Bytes w, Floats x, const std::string& impl) {
    const TypeTraits& t = traits_of(type_id);
    const bool ref = use_ref("quant.vec_dot", impl);
    const SimdLevel level = level_now();
    const CpuKernels& k = cpu_kernels(t.type, level);
    const int64_t n = int64_t(x.size());
    const size_t need = row_bytes(t.type, n);
    if (w.size() != need) fail("quant.vec_dot: ", n, " ", t.name, " weights need ", need, " bytes, w has ", w.size());
    std::vector<uint8_t> xq(row_bytes(k.vec_dot_type, n));
    quantize_activations(k.vec_dot_type, x.data(), xq.data(), n, level);
    return (ref ? k.vec_dot_ref : k.vec_dot)(n, w.data(), xq.data());
}

}  // namespace

void bind_kernel_quant(nb::module_& m) {
    m.def("dequantize", &dequantize, nb::arg("type_id"), nb::arg("data"), nb::arg("n"),
          "Dequantize n elements of a ggml type (row bytes as a uint8 array) to float32.");
    m.def("quantize", &quantize, nb::arg("type_id"), nb::arg("x"), nb::arg("impl") = "ref",
          "Quantize a float32 row to the ggml type's block bytes (uint8 array); impl 'ref' (scalar) "
          "or 'best' (the CPU's activation quantizer, SIMD where there is one: the same bytes).");
    m.def("vec_dot", &vec_dot, nb::arg("type_id"), nb::arg("w"), nb::arg("x"), nb::arg("impl") = "best",
          "Dot product of a weight row (type bytes) with float32 x, which is first quantized to "
          "the type's vec_dot_type; impl 'best' (SIMD) or 'ref' (scalar).");
    m.def(
        "vec_dot_type",
        [](uint32_t type_id) { return uint32_t(cpu_kernels(traits_of(type_id).type, level_now()).vec_dot_type); },
        nb::arg("type_id"), "The type id the CPU quantizes activations to for a dot with this weight type.");
    m.def(
        "simd_level", []() { return std::string(simd_level_name(level_now())); },
        "The SIMD level of the CPU kernels a backend made now would use: 'avx512', 'avx2', 'neon' or "
        "'scalar' (EMBER_SIMD lowers it).");
}
