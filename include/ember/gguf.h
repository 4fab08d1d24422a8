// GGUF reader (mmap, every offset/length checked) and streaming writer.
// Tensor data is used in place from the mapping: no copy of the weights at load.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ember/quant.h"

namespace ember {

// clang-format off: a table of GGUF's ids, kept packed
enum class GGUFType : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
    BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
// clang-format on
const char* gguf_type_name(GGUFType t);

// One metadata value. Scalars use the union; arrays keep their element type and elements.
struct GGUFValue {
    GGUFType type = GGUFType::UINT32;
    union {
        uint64_t u;
        int64_t i;
        double f;
        bool b;
    } num{};
    std::string str;                       // STRING
    GGUFType elem_type = GGUFType::UINT8;  // ARRAY
    std::vector<GGUFValue> arr;            // ARRAY (may nest)

    bool is_integer() const;
    bool is_float() const;
};

struct GGUFTensor {
    std::string name;
    GGMLType type;
    std::vector<int64_t> ne;   // ne[0] is the contiguous (row) dimension, as in ggml
    uint64_t offset;           // relative to the start of the data section
    size_t nbytes;
    const uint8_t* data;       // points into the mapping
    int64_t n_elements() const;
    int64_t n_rows() const { return n_elements() / ne[0]; }
};

class GGUFFile {
public:
    // Throws InvalidInput naming the file and what is wrong. Given the first shard of a split model
    // (NAME-00001-of-0000N.gguf, split.count N > 1, as llama-gguf-split writes), it maps all N shards and
    // tensors() lists every shard's tensors; metadata() is the first shard's. whole_model=false opens
    // this one file only, any shard.
    explicit GGUFFile(const std::string& path, bool whole_model = true);
    ~GGUFFile();
    GGUFFile(const GGUFFile&) = delete;
    GGUFFile& operator=(const GGUFFile&) = delete;

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    size_t alignment() const { return alignment_; }
    size_t file_size() const { return size_; }   // this file only, not the other shards
    // Every file of the model: this one, then the other shards in order.
    std::vector<std::string> split_paths() const;
    const uint8_t* data_section() const { return base_ + data_offset_; }

    const std::vector<std::pair<std::string, GGUFValue>>& metadata() const { return kv_; }
    const GGUFValue* find(const std::string& key) const;   // nullptr if absent

    // Typed getters: throw naming the file and key when missing or of the wrong type.
    uint64_t get_uint(const std::string& key) const;
    int64_t get_int(const std::string& key) const;
    double get_float(const std::string& key) const;
    bool get_bool(const std::string& key) const;
    const std::string& get_string(const std::string& key) const;
    const GGUFValue& get_array(const std::string& key) const;
    // Same with a default used when the key is absent (still throws on a wrong type).
    uint64_t get_uint(const std::string& key, uint64_t dflt) const;
    double get_float(const std::string& key, double dflt) const;
    bool get_bool(const std::string& key, bool dflt) const;
    std::string get_string(const std::string& key, const std::string& dflt) const;

    const std::vector<GGUFTensor>& tensors() const { return tensors_; }
    const GGUFTensor* find_tensor(const std::string& name) const;  // nullptr if absent
    const GGUFTensor& tensor(const std::string& name) const;       // throws if absent

    // Advise the kernel that the mappings (every shard's) will be read.
    void advise_willneed() const;

private:
    void open_shards(uint64_t n_split);

    std::string path_;
    int fd_ = -1;
    const uint8_t* base_ = nullptr;
    size_t size_ = 0;
    uint32_t version_ = 0;
    size_t alignment_ = 32;
    size_t data_offset_ = 0;
    std::vector<std::pair<std::string, GGUFValue>> kv_;
    std::vector<GGUFTensor> tensors_;
    std::vector<std::unique_ptr<GGUFFile>> shards_;   // shards 2..N, kept mapped: tensors_ points into them
};

// llama.cpp's split keys and shard names: PREFIX-00001-of-00003.gguf holds split.no 0.
constexpr const char* kSplitNo = "split.no";
constexpr const char* kSplitCount = "split.count";
constexpr const char* kSplitTensorsCount = "split.tensors.count";
std::string gguf_split_path(const std::string& prefix, uint32_t split_no, uint32_t n_split);

// The shard of each tensor, as llama-gguf-split assigns them: a shard ends after max_tensors tensors, or
// before a tensor that would take its tensor bytes (each padded to `alignment`) past max_bytes; 0 means
// no limit. A tensor larger than max_bytes gets a shard of its own.
std::vector<uint32_t> gguf_split_plan(const std::vector<size_t>& nbytes, uint64_t max_bytes, uint64_t max_tensors,
                                      size_t alignment = 32);

// Streaming writer: metadata and tensor infos first, then each tensor's bytes in order, so a
// converter or quantizer needs only one tensor in memory at a time.
class GGUFWriter {
public:
    explicit GGUFWriter(const std::string& path, size_t alignment = 32);
    ~GGUFWriter();
    void set(const std::string& key, const GGUFValue& value);   // replaces an existing key
    void add_tensor_info(const std::string& name, GGMLType type, const std::vector<int64_t>& ne);
    // Writes header + metadata + tensor infos. Call once, after all set/add_tensor_info.
    void write_header();
    // Writes the next tensor's data (in the order of add_tensor_info); nbytes must match.
    void write_tensor_data(const void* data, size_t nbytes);
    void finish();   // checks every tensor was written, closes the file

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ember
