// The paged-KV bookkeeping (_ember_test.BlockPool, HostTier, KVCache, block_key) for
// tests/test_kv_cache.py. KVCache's storage is simulated: each block (and host slot) holds the token
// ids written into its slots, so tests can check that writes and the copies to the host tier and
// back kept every sequence's bytes and never touched a shared block.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "kv/block_pool.h"
#include "kv/host_tier.h"
#include "kv/kv_cache.h"

namespace nb = nanobind;
using namespace ember;

namespace {

nb::dict stats_dict(const BlockPoolStats& s) {
    nb::dict d;
    d["n_blocks"] = s.n_blocks;
    d["n_used"] = s.n_used;
    d["n_cached"] = s.n_cached;
    d["n_free"] = s.n_free;
    d["lookups"] = s.lookups;
    d["hits"] = s.hits;
    d["evictions"] = s.evictions;
    return d;
}

nb::dict host_stats_dict(const HostTierStats& s) {
    nb::dict d;
    d["n_slots"] = s.n_slots;
    d["n_used"] = s.n_used;
    d["n_cached"] = s.n_cached;
    d["n_free"] = s.n_free;
    d["lookups"] = s.lookups;
    d["hits"] = s.hits;
    d["stores"] = s.stores;
    return d;
}

// A KVCache over simulated storage: content[block][slot] is the token whose KV sits there (-1:
// never written); host_content[slot] the same for the host tier's slots.
struct SimKVCache {
    using Pairs = KVCache::BlockPairs;
    std::vector<std::vector<int32_t>> content;
    std::vector<std::vector<int32_t>> host_content;
    std::vector<std::pair<bool, Pairs>> host_copies;   // (to the host, pairs) of each callback call
    KVCache cache;

    SimKVCache(int32_t n_blocks, int32_t block_size, uint64_t salt, bool prefix_caching, int32_t host_slots)
        : content(std::max(n_blocks, 0), std::vector<int32_t>(std::max(block_size, 0), -1)),
          host_content(std::max(host_slots, 0), std::vector<int32_t>(std::max(block_size, 0), -1)),
          cache(n_blocks, block_size, salt, prefix_caching) {
        if (host_slots != 0)
            cache.enable_host_tier(
                host_slots,
                [this](const Pairs& pairs) {
                    host_copies.emplace_back(true, pairs);
                    for (auto [block, slot] : pairs) host_content.at(slot) = content.at(block);
                },
                [this](const Pairs& pairs) {
                    host_copies.emplace_back(false, pairs);
                    for (auto [slot, block] : pairs) content.at(block) = host_content.at(slot);
                });
    }

    // The engine writes KV between reserve and commit; here at commit, into the sequence's table:
    // a write into a block another sequence holds shows up in that sequence's content.
    void commit(int64_t seq, const std::vector<int32_t>& tokens) {
        // An unknown seq: let commit name the error.
        int32_t start = cache.has(seq) ? cache.n_tokens(seq) : 0;
        cache.commit(seq, tokens.data(), (int32_t)tokens.size());
        const std::vector<int32_t>& table = cache.blocks(seq);
        int32_t bs = cache.block_size();
        for (size_t j = 0; j < tokens.size(); ++j) {
            int32_t pos = start + (int32_t)j;
            content[table[pos / bs]][pos % bs] = tokens[j];
        }
    }
};

}  // namespace

void bind_kv(nb::module_& m) {
    m.def(
        "block_key",
        [](uint64_t parent, const std::vector<int32_t>& tokens, uint64_t salt) {
            return block_key(parent, tokens.data(), (int32_t)tokens.size(), salt);
        },
        nb::arg("parent"), nb::arg("tokens"), nb::arg("salt") = 0);

    nb::class_<BlockPool>(m, "BlockPool")
        .def(nb::init<int32_t>(), nb::arg("n_blocks"))
        .def("allocate", &BlockPool::allocate)
        .def("retain", &BlockPool::retain, nb::arg("block"))
        .def("release", &BlockPool::release, nb::arg("block"))
        .def("lookup", &BlockPool::lookup, nb::arg("key"))
        .def("publish", &BlockPool::publish, nb::arg("block"), nb::arg("key"))
        .def("unpublish", &BlockPool::unpublish, nb::arg("block"))
        .def("published", &BlockPool::published, nb::arg("block"))
        .def("refs", &BlockPool::refs, nb::arg("block"))
        .def_prop_ro("n_available", &BlockPool::n_available)
        .def_prop_ro("n_blocks", &BlockPool::n_blocks)
        .def("stats", [](const BlockPool& p) { return stats_dict(p.stats()); })
        .def("clear_cache", &BlockPool::clear_cache);

    nb::class_<HostTier>(m, "HostTier")
        .def(nb::init<int32_t>(), nb::arg("n_slots"))
        .def("take", &HostTier::take, nb::arg("n"))
        .def_prop_ro("n_available", &HostTier::n_available)
        .def("give_back", &HostTier::give_back, nb::arg("slot"))
        .def("store", &HostTier::store, nb::arg("key"))
        .def("lookup", &HostTier::lookup, nb::arg("key"))
        .def("pin", &HostTier::pin, nb::arg("slot"))
        .def("end_step", &HostTier::end_step)
        .def("clear_cache", &HostTier::clear_cache)
        .def_prop_ro("n_slots", &HostTier::n_slots)
        .def("stats", [](const HostTier& h) { return host_stats_dict(h.stats()); });

    nb::class_<SimKVCache>(m, "KVCache")
        .def(nb::init<int32_t, int32_t, uint64_t, bool, int32_t>(), nb::arg("n_blocks"), nb::arg("block_size"),
             nb::arg("salt") = 0, nb::arg("prefix_caching") = true, nb::arg("host_slots") = 0)
        .def(
            "add", [](SimKVCache& s, int64_t seq) { s.cache.add(seq); }, nb::arg("seq"))
        .def(
            "remove", [](SimKVCache& s, int64_t seq) { s.cache.remove(seq); }, nb::arg("seq"))
        .def(
            "has", [](const SimKVCache& s, int64_t seq) { return s.cache.has(seq); }, nb::arg("seq"))
        .def(
            "match_prefix",
            [](SimKVCache& s, int64_t seq, const std::vector<int32_t>& tokens) {
                return s.cache.match_prefix(seq, tokens.data(), (int32_t)tokens.size());
            },
            nb::arg("seq"), nb::arg("tokens"))
        .def(
            "reserve", [](SimKVCache& s, int64_t seq, int32_t n) { return s.cache.reserve(seq, n); }, nb::arg("seq"),
            nb::arg("n"))
        .def(
            "blocks_needed", [](const SimKVCache& s, int64_t seq, int32_t n) { return s.cache.blocks_needed(seq, n); },
            nb::arg("seq"), nb::arg("n"))
        .def("commit", &SimKVCache::commit, nb::arg("seq"), nb::arg("tokens"))
        .def(
            "truncate", [](SimKVCache& s, int64_t seq, int32_t n) { s.cache.truncate(seq, n); }, nb::arg("seq"),
            nb::arg("n_tokens"))
        .def(
            "n_tokens", [](const SimKVCache& s, int64_t seq) { return s.cache.n_tokens(seq); }, nb::arg("seq"))
        .def(
            "blocks", [](const SimKVCache& s, int64_t seq) { return s.cache.blocks(seq); }, nb::arg("seq"))
        .def(
            "tokens", [](const SimKVCache& s, int64_t seq) { return s.cache.tokens(seq); }, nb::arg("seq"))
        .def_prop_ro("block_size", [](const SimKVCache& s) { return s.cache.block_size(); })
        .def_prop_ro("n_sequences", [](const SimKVCache& s) { return s.cache.n_sequences(); })
        .def_prop_ro("n_available", [](const SimKVCache& s) { return s.cache.pool().n_available(); })
        .def(
            "refs", [](const SimKVCache& s, int32_t b) { return s.cache.pool().refs(b); }, nb::arg("block"))
        .def(
            "published", [](const SimKVCache& s, int32_t b) { return s.cache.pool().published(b); }, nb::arg("block"))
        .def("stats", [](const SimKVCache& s) { return stats_dict(s.cache.pool().stats()); })
        .def("clear_cache", [](SimKVCache& s) { s.cache.pool().clear_cache(); })
        // Simulated storage: the token ids in `block`'s slots.
        .def(
            "content", [](const SimKVCache& s, int32_t b) { return s.content.at(b); }, nb::arg("block"))
        // The host tier: swaps, the queued copies, and the simulated host slots.
        .def(
            "swap_out", [](SimKVCache& s, int64_t seq) { return s.cache.swap_out(seq); }, nb::arg("seq"))
        .def(
            "swap_in", [](SimKVCache& s, int64_t seq) { return s.cache.swap_in(seq); }, nb::arg("seq"))
        .def(
            "swapped", [](const SimKVCache& s, int64_t seq) { return s.cache.swapped(seq); }, nb::arg("seq"))
        .def("flush_host_copies", [](SimKVCache& s) { s.cache.flush_host_copies(); })
        .def_prop_ro("host_copies_pending", [](const SimKVCache& s) { return s.cache.host_copies_pending(); })
        .def("host_stats",
             [](const SimKVCache& s) -> nb::object {
                 const HostTier* h = s.cache.host_tier();
                 return h ? nb::object(host_stats_dict(h->stats())) : nb::none();
             })
        .def(
            "host_content", [](const SimKVCache& s, int32_t slot) { return s.host_content.at(slot); }, nb::arg("slot"))
        .def_prop_ro("host_copies", [](const SimKVCache& s) { return s.host_copies; });
}
