// Split models (llama-gguf-split's format): finding and checking the other shards of a first shard,
// shard names, and the rule that assigns tensors to shards when writing.
#include <unistd.h>

#include <cstdio>
#include <unordered_map>

#include "ember/gguf.h"
#include "ember/status.h"

namespace ember {

std::string gguf_split_path(const std::string& prefix, uint32_t split_no, uint32_t n_split) {
    char suffix[48];
    std::snprintf(suffix, sizeof(suffix), "-%05u-of-%05u.gguf", split_no + 1, n_split);
    return prefix + suffix;
}

std::vector<uint32_t> gguf_split_plan(const std::vector<size_t>& nbytes, uint64_t max_bytes, uint64_t max_tensors,
                                      size_t alignment) {
    std::vector<uint32_t> shard_of(nbytes.size());
    uint32_t shard = 0;
    uint64_t bytes = 0, count = 0;
    for (size_t i = 0; i < nbytes.size(); ++i) {
        const uint64_t padded = (nbytes[i] + alignment - 1) / alignment * alignment;
        const bool full = count > 0 &&
                          ((max_tensors && count >= max_tensors) || (max_bytes && bytes + padded > max_bytes));
        if (full) {
            ++shard;
            bytes = count = 0;
        }
        bytes += padded;
        ++count;
        shard_of[i] = shard;
    }
    return shard_of;
}

void GGUFFile::open_shards(uint64_t n_split) {
    if (n_split > 99999) fail(path_, ": split.count ", n_split, " is more than a shard name can number (99999)");
    const uint64_t no = get_uint(kSplitNo, 0);
    if (no >= n_split) fail(path_, ": split.no ", no, " is not below split.count ", n_split);
    const auto n = static_cast<uint32_t>(n_split);
    // Shards are found by name only: the first shard's name gives the prefix of the others.
    const std::string suffix = gguf_split_path("", static_cast<uint32_t>(no), n);
    const bool named = path_.size() > suffix.size() &&
                       path_.compare(path_.size() - suffix.size(), suffix.size(), suffix) == 0;
    const std::string prefix = named ? path_.substr(0, path_.size() - suffix.size()) : std::string();
    if (no != 0)
        fail(path_, ": this is shard ", no + 1, " of ", n, " of a split model; give its first shard ",
             named ? cat("'", gguf_split_path(prefix, 0, n), "'") : std::string("(the one with split.no 0)"));
    if (!named)
        fail(path_, ": this is the first of ", n, " shards of a split model, but its name does not end in '", suffix,
             "', so the other shards cannot be found (llama-gguf-split names them PREFIX", suffix, ", PREFIX",
             gguf_split_path("", 1, n), ", ...)");

    std::unordered_map<std::string, uint32_t> shard_of;
    for (const GGUFTensor& t : tensors_) shard_of.emplace(t.name, 0);
    for (uint32_t k = 1; k < n; ++k) {
        const std::string p = gguf_split_path(prefix, k, n);
        if (::access(p.c_str(), F_OK) != 0)
            fail(path_, ": missing shard '", p, "' (shard ", k + 1, " of the ", n, " its split.count names)");
        auto shard = std::make_unique<GGUFFile>(p, false);
        const uint64_t count = shard->get_uint(kSplitCount, 0);
        if (count != n_split)
            fail(p, ": split.count is ", count, " but the first shard '", path_, "' says ", n_split,
                 " (shards of different splits mixed?)");
        const uint64_t shard_no = shard->get_uint(kSplitNo, 0);
        if (shard_no != k)
            fail(p, ": split.no is ", shard_no, " but its name makes it shard ", k, " (counting from 0)");
        for (const GGUFTensor& t : shard->tensors()) {
            const auto [it, fresh] = shard_of.emplace(t.name, k);
            if (!fresh)
                fail(p, ": tensor '", t.name, "' is also in shard '", gguf_split_path(prefix, it->second, n),
                     "' (duplicate tensor name)");
            tensors_.push_back(t);
        }
        shards_.push_back(std::move(shard));
    }
    const int64_t expected = get_int(kSplitTensorsCount);
    if (expected < 0 || static_cast<uint64_t>(expected) != tensors_.size())
        fail(path_, ": split.tensors.count says the model has ", expected, " tensors but its ", n, " shards hold ",
             tensors_.size());
}

std::vector<std::string> GGUFFile::split_paths() const {
    std::vector<std::string> paths{path_};
    for (const auto& s : shards_) paths.push_back(s->path());
    return paths;
}

}  // namespace ember
