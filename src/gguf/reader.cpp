// GGUFFile: maps a GGUF v2/v3 file read-only and parses header, metadata and tensor infos.
// Every count, length and offset is checked against the bytes left in the file before it is
// used, so a truncated or hostile file raises InvalidInput instead of reading out of bounds.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "ember/gguf.h"
#include "ember/status.h"
#include "gguf/value_util.h"

namespace ember {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr int kMaxArrayDepth = 32;        // bounds recursion on nested arrays
// Metadata arrays are expanded into GGUFValues (~80 bytes each); the largest real vocabularies
// hold a few hundred thousand entries, so this cap only stops garbage counts from exhausting memory.
constexpr uint64_t kMaxArrayElements = uint64_t(1) << 24;
// Smallest possible tensor info: name length u64 + n_dims u32 + one dim u64 + type u32 + offset u64.
constexpr size_t kMinTensorInfo = 8 + 4 + 8 + 4 + 8;
// Smallest possible key/value: key length u64 + value type u32 + a one-byte value.
constexpr size_t kMinKV = 8 + 4 + 1;

// Bounds-checked little-endian reads over the mapping. `what` names the item being read.
class Cursor {
public:
    Cursor(const uint8_t* base, size_t size, const std::string& path) : base_(base), size_(size), path_(path) {}

    size_t pos() const { return pos_; }
    size_t remaining() const { return size_ - pos_; }

    void need(uint64_t n, const std::string& what) const {
        if (n > remaining())
            fail(path_, ": truncated file: ", what, " at offset ", pos_, " needs ", n, " bytes but only ", remaining(),
                 " remain (file size ", size_, ")");
    }

    template <class T>
    T read(const std::string& what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, base_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string read_string(const std::string& what) {
        uint64_t len = read<uint64_t>(cat("length of ", what));
        if (len > remaining())
            fail(path_, ": truncated file: string length ", len, " of ", what, " at offset ", pos_,
                 " runs past the end of the file (", remaining(), " bytes remain)");
        std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
        pos_ += static_cast<size_t>(len);
        return s;
    }

private:
    const uint8_t* base_;
    size_t size_;
    size_t pos_ = 0;
    const std::string& path_;
};

class Parser {
public:
    Parser(Cursor& c, const std::string& path) : c_(c), path_(path) {}

    GGUFValue value(uint32_t type_id, const std::string& ctx, int depth) {
        if (!gguf_type_valid(type_id)) fail(path_, ": ", ctx, " has unknown value type ", type_id, " (expected 0..12)");
        GGUFValue v;
        v.type = static_cast<GGUFType>(type_id);
        switch (v.type) {
            case GGUFType::UINT8: v.num.u = c_.read<uint8_t>(ctx); break;
            case GGUFType::INT8: v.num.i = c_.read<int8_t>(ctx); break;
            case GGUFType::UINT16: v.num.u = c_.read<uint16_t>(ctx); break;
            case GGUFType::INT16: v.num.i = c_.read<int16_t>(ctx); break;
            case GGUFType::UINT32: v.num.u = c_.read<uint32_t>(ctx); break;
            case GGUFType::INT32: v.num.i = c_.read<int32_t>(ctx); break;
            case GGUFType::UINT64: v.num.u = c_.read<uint64_t>(ctx); break;
            case GGUFType::INT64: v.num.i = c_.read<int64_t>(ctx); break;
            case GGUFType::FLOAT32: v.num.f = c_.read<float>(ctx); break;
            case GGUFType::FLOAT64: v.num.f = c_.read<double>(ctx); break;
            case GGUFType::BOOL:
                v.num.u = 0;
                v.num.b = c_.read<uint8_t>(ctx) != 0;
                break;
            case GGUFType::STRING: v.str = c_.read_string(ctx); break;
            case GGUFType::ARRAY: array(v, ctx, depth); break;
        }
        return v;
    }

private:
    void array(GGUFValue& v, const std::string& ctx, int depth) {
        if (depth >= kMaxArrayDepth) fail(path_, ": ", ctx, " nests arrays deeper than ", kMaxArrayDepth, " levels");
        uint32_t elem = c_.read<uint32_t>(cat("array element type of ", ctx));
        if (!gguf_type_valid(elem))
            fail(path_, ": ", ctx, " is an array of unknown value type ", elem, " (expected 0..12)");
        v.elem_type = static_cast<GGUFType>(elem);
        uint64_t count = c_.read<uint64_t>(cat("array count of ", ctx));
        size_t min_size = gguf_min_value_size(v.elem_type);
        if (count > c_.remaining() / min_size)
            fail(path_, ": truncated file: array count ", count, " of ", ctx, " (", gguf_type_name(v.elem_type),
                 " elements) runs past the end of the file (", c_.remaining(), " bytes remain)");
        if (count > kMaxArrayElements - total_elements_)
            fail(path_, ": ", ctx, ": array count ", count, " exceeds the limit of ", kMaxArrayElements,
                 " metadata array elements in total");
        total_elements_ += count;
        v.arr.reserve(static_cast<size_t>(count));
        for (uint64_t k = 0; k < count; ++k) v.arr.push_back(value(elem, ctx, depth + 1));
    }

    Cursor& c_;
    const std::string& path_;
    uint64_t total_elements_ = 0;
};

size_t checked_align_up(size_t x, size_t a, const std::string& path) {
    size_t pad = (a - x % a) % a;
    if (x > std::numeric_limits<size_t>::max() - pad) fail(path, ": data section offset overflows");
    return x + pad;
}

}  // namespace

int64_t GGUFTensor::n_elements() const {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    return n;
}

GGUFFile::GGUFFile(const std::string& path, bool whole_model) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(path, ": cannot open GGUF file: ", std::strerror(errno));
    try {
        struct stat st;
        if (::fstat(fd_, &st) != 0) fail(path, ": cannot stat GGUF file: ", std::strerror(errno));
        if (!S_ISREG(st.st_mode)) fail(path, ": not a regular file");
        size_ = static_cast<size_t>(st.st_size);
        if (size_ < 4) fail(path, ": truncated file: ", size_, " bytes is smaller than the GGUF magic");
        // Read-only shared mapping: tensor data is used in place and pages stay in the page cache.
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
        if (p == MAP_FAILED) fail(path, ": cannot mmap GGUF file: ", std::strerror(errno));
        base_ = static_cast<const uint8_t*>(p);

        Cursor c(base_, size_, path_);
        uint32_t magic = c.read<uint32_t>("magic");
        if (magic != kMagic) fail(path, ": bad magic: not a GGUF file (expected the bytes 'GGUF' at offset 0)");
        version_ = c.read<uint32_t>("header version");
        if (version_ == 1) fail(path, ": GGUF version 1 is not supported (expected version 2 or 3)");
        if (version_ != 2 && version_ != 3)
            fail(path, ": unsupported GGUF version ", version_, (version_ & 0xFFFF) == 0 ? " (a big-endian file?)" : "",
                 " (expected version 2 or 3)");
        uint64_t n_tensors = c.read<uint64_t>("header tensor count");
        uint64_t n_kv = c.read<uint64_t>("header metadata count");
        if (n_kv > c.remaining() / kMinKV)
            fail(path, ": header metadata count n_kv=", n_kv, " is more than the file can hold (", c.remaining(),
                 " bytes remain)");
        if (n_tensors > (c.remaining() - n_kv * kMinKV) / kMinTensorInfo)
            fail(path, ": header tensor count n_tensors=", n_tensors, " is more than the file can hold (",
                 c.remaining(), " bytes remain)");

        Parser parser(c, path_);
        std::unordered_set<std::string> keys;
        kv_.reserve(static_cast<size_t>(n_kv));
        for (uint64_t k = 0; k < n_kv; ++k) {
            std::string key = c.read_string(cat("metadata key #", k));
            std::string ctx = cat("metadata key '", key, "'");
            if (!keys.insert(key).second) fail(path, ": duplicate metadata key '", key, "'");
            uint32_t type = c.read<uint32_t>(cat("value type of ", ctx));
            kv_.emplace_back(key, parser.value(type, ctx, 0));
        }

        if (const GGUFValue* a = find("general.alignment")) {
            if (!a->is_integer() || (gguf_type_signed(a->type) && a->num.i < 0) || !gguf_is_pow2(a->num.u) ||
                a->num.u > (uint64_t(1) << 30))
                fail(path,
                     ": metadata key 'general.alignment' must be a power-of-two integer up to 2^30 "
                     "(got type ",
                     gguf_type_name(a->type), ")");
            alignment_ = static_cast<size_t>(a->num.u);
        }

        std::unordered_set<std::string> names;
        tensors_.reserve(static_cast<size_t>(n_tensors));
        for (uint64_t k = 0; k < n_tensors; ++k) {
            GGUFTensor t;
            t.name = c.read_string(cat("tensor info #", k, " name"));
            std::string ctx = cat("tensor '", t.name, "'");
            if (!names.insert(t.name).second) fail(path, ": duplicate tensor name '", t.name, "'");
            uint32_t n_dims = c.read<uint32_t>(cat("n_dims of ", ctx));
            if (n_dims < 1 || n_dims > 4) fail(path, ": ", ctx, " has n_dims=", n_dims, " (expected 1..4 dimensions)");
            int64_t n_el = 1;
            for (uint32_t d = 0; d < n_dims; ++d) {
                uint64_t ne = c.read<uint64_t>(cat("dimension ", d, " of ", ctx));
                if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                    fail(path, ": ", ctx, " has dimension ne[", d, "]=", ne, " (expected 1..2^63-1)");
                t.ne.push_back(static_cast<int64_t>(ne));
                if (__builtin_mul_overflow(n_el, static_cast<int64_t>(ne), &n_el))
                    fail(path, ": ", ctx, ": product of dimensions overflows int64");
            }
            uint32_t type_id = c.read<uint32_t>(cat("type of ", ctx));
            const TypeTraits* tt = find_type_traits(type_id);
            if (!tt) fail(path, ": ", ctx, " has unknown tensor type ", type_id);
            t.type = static_cast<GGMLType>(type_id);
            if (t.ne[0] % tt->block_elems != 0)
                fail(path, ": ", ctx, " of type ", tt->name, " has ne[0]=", t.ne[0],
                     ", not a multiple of the block size ", tt->block_elems);
            uint64_t nbytes;
            if (__builtin_mul_overflow(static_cast<uint64_t>(n_el / tt->block_elems),
                                       static_cast<uint64_t>(tt->block_bytes), &nbytes) ||
                nbytes > std::numeric_limits<size_t>::max())
                fail(path, ": ", ctx, ": size in bytes of ", n_el, " elements of ", tt->name, " overflows");
            t.nbytes = static_cast<size_t>(nbytes);
            t.offset = c.read<uint64_t>(cat("data offset of ", ctx));
            if (t.offset % alignment_ != 0)
                fail(path, ": ", ctx, " has data offset ", t.offset, ", not aligned to the alignment ", alignment_);
            tensors_.push_back(std::move(t));
        }

        data_offset_ = checked_align_up(c.pos(), alignment_, path_);
        if (data_offset_ > size_) {
            if (!tensors_.empty())
                fail(path, ": truncated file: data section starts at ", data_offset_, " beyond the file size ", size_);
            data_offset_ = size_;
        }
        const size_t data_size = size_ - data_offset_;
        for (GGUFTensor& t : tensors_) {
            if (t.offset > data_size || t.nbytes > data_size - t.offset)
                fail(path, ": data of tensor '", t.name, "' (offset ", t.offset, ", ", t.nbytes,
                     " bytes) lies outside the file (data section holds ", data_size,
                     " bytes; is the file truncated?)");
            t.data = base_ + data_offset_ + t.offset;
        }
        std::vector<const GGUFTensor*> order;
        order.reserve(tensors_.size());
        for (const GGUFTensor& t : tensors_) order.push_back(&t);
        std::sort(order.begin(), order.end(),
                  [](const GGUFTensor* a, const GGUFTensor* b) { return a->offset < b->offset; });
        for (size_t k = 1; k < order.size(); ++k)
            if (order[k - 1]->offset + order[k - 1]->nbytes > order[k]->offset)
                fail(path, ": data of tensors '", order[k - 1]->name, "' and '", order[k]->name, "' overlap");
        // llama-gguf-split --merge leaves split.count 0 in the merged file: one file, like no key at all.
        const uint64_t n_split = get_uint(kSplitCount, 0);
        if (whole_model && n_split > 1) open_shards(n_split);
    } catch (...) {
        if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
        ::close(fd_);
        throw;
    }
}

GGUFFile::~GGUFFile() {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
    if (fd_ >= 0) ::close(fd_);
}

void GGUFFile::advise_willneed() const {
    // Advice only: a failure changes performance, never results.
    if (base_) ::madvise(const_cast<uint8_t*>(base_), size_, MADV_WILLNEED);
    for (const auto& s : shards_) s->advise_willneed();
}

const GGUFTensor* GGUFFile::find_tensor(const std::string& name) const {
    for (const GGUFTensor& t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

const GGUFTensor& GGUFFile::tensor(const std::string& name) const {
    const GGUFTensor* t = find_tensor(name);
    if (!t) fail("missing tensor '", name, "' in ", path_);
    return *t;
}

}  // namespace ember
