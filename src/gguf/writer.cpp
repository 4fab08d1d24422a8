// GGUFWriter: streams a GGUF v3 file: header, metadata and tensor infos, then each tensor's
// bytes in the order the infos were added, every tensor starting at a multiple of the alignment.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "ember/gguf.h"
#include "ember/status.h"
#include "gguf/value_util.h"

namespace ember {

struct GGUFWriter::Impl {
    struct Info {
        std::string name;
        GGMLType type;
        std::vector<int64_t> ne;
        uint64_t offset;   // relative to the data section
        size_t nbytes;
    };

    std::string path;
    size_t alignment;
    FILE* f = nullptr;
    std::vector<std::pair<std::string, GGUFValue>> kv;
    std::vector<Info> infos;
    std::unordered_set<std::string> names;
    uint64_t data_end = 0;   // end of the last tensor added, relative to the data section
    bool header_written = false;
    bool finished = false;
    size_t next = 0;         // index of the next tensor whose data is expected
    uint64_t pos = 0;        // bytes written so far

    void put(const void* p, size_t n) {
        if (n && std::fwrite(p, 1, n, f) != n)
            throw std::runtime_error(cat(path, ": write failed: ", std::strerror(errno)));
        pos += n;
    }
    template <class T>
    void put_scalar(T v) {
        put(&v, sizeof(T));
    }
    void put_string(const std::string& s) {
        put_scalar<uint64_t>(s.size());
        put(s.data(), s.size());
    }
    void pad() {
        static const uint8_t zeros[256] = {};
        size_t n = static_cast<size_t>((alignment - pos % alignment) % alignment);
        while (n) {
            size_t k = n < sizeof(zeros) ? n : sizeof(zeros);
            put(zeros, k);
            n -= k;
        }
    }

    void check_range(const GGUFValue& v, const std::string& ctx, int64_t lo, int64_t hi) {
        if (v.num.i < lo || v.num.i > hi)
            fail(path, ": ", ctx, " value ", v.num.i, " does not fit in ", gguf_type_name(v.type));
    }
    void check_urange(const GGUFValue& v, const std::string& ctx, uint64_t hi) {
        if (v.num.u > hi) fail(path, ": ", ctx, " value ", v.num.u, " does not fit in ", gguf_type_name(v.type));
    }

    // Checks a value before anything is written, so a bad value never leaves a half-written file.
    void validate(const GGUFValue& v, const std::string& ctx) {
        if (!gguf_type_valid(static_cast<uint32_t>(v.type)))
            fail(path, ": ", ctx, " has unknown value type ", static_cast<uint32_t>(v.type));
        switch (v.type) {
            case GGUFType::UINT8: check_urange(v, ctx, 0xFF); break;
            case GGUFType::UINT16: check_urange(v, ctx, 0xFFFF); break;
            case GGUFType::UINT32: check_urange(v, ctx, 0xFFFFFFFFu); break;
            case GGUFType::INT8: check_range(v, ctx, -128, 127); break;
            case GGUFType::INT16: check_range(v, ctx, -32768, 32767); break;
            case GGUFType::INT32:
                check_range(v, ctx, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
                break;
            case GGUFType::ARRAY:
                if (!gguf_type_valid(static_cast<uint32_t>(v.elem_type)))
                    fail(path, ": ", ctx, " is an array of unknown value type ", static_cast<uint32_t>(v.elem_type));
                for (const GGUFValue& e : v.arr) {
                    if (e.type != v.elem_type)
                        fail(path, ": ", ctx, " is an array of ", gguf_type_name(v.elem_type),
                             " but holds an element of type ", gguf_type_name(e.type));
                    validate(e, ctx);
                }
                break;
            default: break;
        }
    }

    void put_value(const GGUFValue& v) {
        switch (v.type) {
            case GGUFType::UINT8: put_scalar<uint8_t>(static_cast<uint8_t>(v.num.u)); break;
            case GGUFType::INT8: put_scalar<int8_t>(static_cast<int8_t>(v.num.i)); break;
            case GGUFType::UINT16: put_scalar<uint16_t>(static_cast<uint16_t>(v.num.u)); break;
            case GGUFType::INT16: put_scalar<int16_t>(static_cast<int16_t>(v.num.i)); break;
            case GGUFType::UINT32: put_scalar<uint32_t>(static_cast<uint32_t>(v.num.u)); break;
            case GGUFType::INT32: put_scalar<int32_t>(static_cast<int32_t>(v.num.i)); break;
            case GGUFType::UINT64: put_scalar<uint64_t>(v.num.u); break;
            case GGUFType::INT64: put_scalar<int64_t>(v.num.i); break;
            case GGUFType::FLOAT32: put_scalar<float>(static_cast<float>(v.num.f)); break;
            case GGUFType::FLOAT64: put_scalar<double>(v.num.f); break;
            case GGUFType::BOOL: put_scalar<uint8_t>(v.num.b ? 1 : 0); break;
            case GGUFType::STRING: put_string(v.str); break;
            case GGUFType::ARRAY:
                put_scalar<uint32_t>(static_cast<uint32_t>(v.elem_type));
                put_scalar<uint64_t>(v.arr.size());
                for (const GGUFValue& e : v.arr) put_value(e);
                break;
        }
    }
};

GGUFWriter::GGUFWriter(const std::string& path, size_t alignment) : impl_(new Impl) {
    impl_->path = path;
    if (!gguf_is_pow2(alignment) || alignment > (size_t(1) << 30))
        fail(path, ": GGUFWriter alignment ", alignment, " must be a power of two up to 2^30");
    impl_->alignment = alignment;
    impl_->f = std::fopen(path.c_str(), "wb");
    if (!impl_->f) fail(path, ": cannot open for writing: ", std::strerror(errno));
}

GGUFWriter::~GGUFWriter() {
    if (impl_ && impl_->f) std::fclose(impl_->f);
}

void GGUFWriter::set(const std::string& key, const GGUFValue& value) {
    Impl& w = *impl_;
    if (w.header_written) fail(w.path, ": GGUFWriter.set('", key, "') called after write_header");
    w.validate(value, cat("metadata key '", key, "'"));
    for (auto& kv : w.kv)
        if (kv.first == key) {
            kv.second = value;
            return;
        }
    w.kv.emplace_back(key, value);
}

void GGUFWriter::add_tensor_info(const std::string& name, GGMLType type, const std::vector<int64_t>& ne) {
    Impl& w = *impl_;
    if (w.header_written) fail(w.path, ": GGUFWriter.add_tensor_info('", name, "') called after write_header");
    if (!w.names.insert(name).second) fail(w.path, ": duplicate tensor name '", name, "'");
    const TypeTraits* tt = find_type_traits(static_cast<uint32_t>(type));
    if (!tt) {
        w.names.erase(name);
        fail(w.path, ": tensor '", name, "' has unknown tensor type ", static_cast<uint32_t>(type));
    }
    try {
        if (ne.empty() || ne.size() > 4)
            fail(w.path, ": tensor '", name, "' has ", ne.size(), " dimensions (expected 1..4)");
        int64_t n = 1;
        for (size_t d = 0; d < ne.size(); ++d) {
            if (ne[d] < 1) fail(w.path, ": tensor '", name, "' has dimension ne[", d, "]=", ne[d], " (expected >= 1)");
            if (__builtin_mul_overflow(n, ne[d], &n))
                fail(w.path, ": tensor '", name, "': product of dimensions overflows int64");
        }
        if (ne[0] % tt->block_elems != 0)
            fail(w.path, ": tensor '", name, "' of type ", tt->name, " has ne[0]=", ne[0],
                 ", not a multiple of the block size ", tt->block_elems);
        uint64_t nbytes = static_cast<uint64_t>(n / tt->block_elems) * static_cast<uint64_t>(tt->block_bytes);
        uint64_t offset = w.data_end + (w.alignment - w.data_end % w.alignment) % w.alignment;
        w.infos.push_back({name, type, ne, offset, static_cast<size_t>(nbytes)});
        w.data_end = offset + nbytes;
    } catch (...) {
        w.names.erase(name);
        throw;
    }
}

void GGUFWriter::write_header() {
    Impl& w = *impl_;
    if (w.header_written) fail(w.path, ": GGUFWriter.write_header called twice");
    // A reader learns a non-default alignment only from general.alignment, so it must agree.
    bool has_alignment = false;
    for (const auto& kv : w.kv)
        if (kv.first == "general.alignment") {
            const GGUFValue& a = kv.second;
            if (!a.is_integer() || a.num.u != w.alignment)
                fail(w.path, ": metadata key 'general.alignment' disagrees with the writer alignment ", w.alignment);
            has_alignment = true;
        }
    if (!has_alignment && w.alignment != 32) {
        GGUFValue a;
        a.type = GGUFType::UINT32;
        a.num.u = w.alignment;
        w.kv.emplace_back("general.alignment", a);
    }
    w.header_written = true;
    w.put_scalar<uint32_t>(0x46554747);   // "GGUF"
    w.put_scalar<uint32_t>(3);
    w.put_scalar<uint64_t>(w.infos.size());
    w.put_scalar<uint64_t>(w.kv.size());
    for (const auto& kv : w.kv) {
        w.put_string(kv.first);
        w.put_scalar<uint32_t>(static_cast<uint32_t>(kv.second.type));
        w.put_value(kv.second);
    }
    for (const Impl::Info& t : w.infos) {
        w.put_string(t.name);
        w.put_scalar<uint32_t>(static_cast<uint32_t>(t.ne.size()));
        for (int64_t d : t.ne) w.put_scalar<uint64_t>(static_cast<uint64_t>(d));
        w.put_scalar<uint32_t>(static_cast<uint32_t>(t.type));
        w.put_scalar<uint64_t>(t.offset);
    }
    w.pad();
    w.pos = 0;   // from here on, positions are relative to the data section
}

void GGUFWriter::write_tensor_data(const void* data, size_t nbytes) {
    Impl& w = *impl_;
    if (!w.header_written) fail(w.path, ": GGUFWriter.write_tensor_data called before write_header");
    if (w.finished) fail(w.path, ": GGUFWriter.write_tensor_data called after finish");
    if (w.next >= w.infos.size())
        fail(w.path, ": GGUFWriter.write_tensor_data: all ", w.infos.size(), " tensors were already written");
    const Impl::Info& t = w.infos[w.next];
    if (nbytes != t.nbytes) fail(w.path, ": tensor '", t.name, "' data has ", nbytes, " bytes, expected ", t.nbytes);
    w.pad();
    w.put(data, nbytes);
    ++w.next;
}

void GGUFWriter::finish() {
    Impl& w = *impl_;
    if (w.finished) return;
    if (!w.header_written) fail(w.path, ": GGUFWriter.finish called before write_header");
    if (w.next != w.infos.size())
        fail(w.path, ": GGUFWriter.finish: only ", w.next, " of ", w.infos.size(),
             " tensors were written (next expected: '", w.infos[w.next].name, "')");
    w.pad();
    w.finished = true;
    FILE* f = w.f;
    w.f = nullptr;
    if (std::fclose(f) != 0) throw std::runtime_error(cat(w.path, ": close failed: ", std::strerror(errno)));
}

}  // namespace ember
