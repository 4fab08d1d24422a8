"""The paged-KV bookkeeping (src/kv): the block pool's refcounts, free list and LRU prefix cache,
block_key, the host tier's slots, and KVCache's sequences (reserve/commit, prefix matching,
truncate, swapping out to the host tier and back, evicted blocks kept there) over the simulated
storage of _ember_test.KVCache (each block and host slot holds the token ids written into it, so a
copy or a stray write shows up in the content). Sequences share full blocks only: no block is
ever copied on the device, and truncate refuses to cut inside a shared block."""
import pytest

from conftest import kernel_module, rng_for

K = kernel_module()


def feed(kv, seq, tokens):
    """Reserve room for `tokens` and commit them (the engine's write step: the copies to and from
    the host tier queued by then run before the forward writes the KV)."""
    assert kv.reserve(seq, len(tokens))
    kv.flush_host_copies()
    kv.commit(seq, list(tokens))


def stored(kv, seq):
    """The token ids the simulated storage holds for seq's positions, read through its table."""
    bs, blocks = kv.block_size, kv.blocks(seq)
    return [kv.content(blocks[p // bs])[p % bs] for p in range(kv.n_tokens(seq))]


# --- BlockPool ---------------------------------------------------------------------------------

def test_allocate_release_refcounts():
    pool = K.BlockPool(4)
    a, b = pool.allocate(), pool.allocate()
    assert a != b and pool.refs(a) == 1 and pool.refs(b) == 1
    pool.retain(a)
    assert pool.refs(a) == 2
    assert pool.stats() == dict(n_blocks=4, n_used=2, n_cached=0, n_free=2, lookups=0, hits=0, evictions=0)
    pool.release(a)
    assert pool.refs(a) == 1 and pool.stats()["n_used"] == 2
    pool.release(a)
    pool.release(b)
    assert pool.refs(a) == 0 and pool.n_available == 4
    assert pool.stats()["n_free"] == 4


def test_allocate_returns_minus_one_when_exhausted():
    pool = K.BlockPool(3)
    got = [pool.allocate() for _ in range(3)]
    assert sorted(got) == [0, 1, 2]
    assert pool.allocate() == -1
    assert pool.allocate() == -1
    assert pool.n_available == 0
    pool.release(got[1])
    assert pool.allocate() == got[1]


def test_publish_lookup_counts_hits():
    pool = K.BlockPool(4)
    b = pool.allocate()
    key = K.block_key(0, [1, 2, 3, 4])
    assert pool.lookup(key) == -1
    pool.publish(b, key)
    assert pool.published(b)
    assert pool.lookup(key) == b and pool.refs(b) == 2
    pool.release(b)
    pool.release(b)
    s = pool.stats()
    assert (s["n_used"], s["n_cached"], s["n_free"]) == (0, 1, 3)
    # A cached block comes back through its key, off the LRU list.
    assert pool.lookup(key) == b and pool.refs(b) == 1
    s = pool.stats()
    assert (s["lookups"], s["hits"], s["n_cached"], s["n_used"]) == (3, 2, 0, 1)


def test_cached_blocks_evicted_in_lru_order_after_free_ones():
    pool = K.BlockPool(5)
    blocks = [pool.allocate() for _ in range(4)]
    keys = [K.block_key(0, [i]) for i in range(4)]
    for b, k in zip(blocks, keys):
        pool.publish(b, k)
    # Released in the order 2, 0, 3, 1: that is the eviction order.
    for i in (2, 0, 3, 1):
        pool.release(blocks[i])
    assert pool.stats()["n_cached"] == 4 and pool.n_available == 5
    # The one never-published free block goes first, no eviction.
    first = pool.allocate()
    assert first not in blocks and pool.stats()["evictions"] == 0
    # A lookup takes block 0 off the list: it is not evictable while in use.
    assert pool.lookup(keys[0]) == blocks[0]
    assert pool.allocate() == blocks[2]
    assert pool.lookup(keys[2]) == -1, "an evicted block's key is dropped"
    assert pool.allocate() == blocks[3]
    assert pool.allocate() == blocks[1]
    assert pool.allocate() == -1
    s = pool.stats()
    assert s["evictions"] == 3 and s["n_cached"] == 0 and s["n_used"] == 5
    assert not any(pool.published(b) for b in (blocks[1], blocks[2], blocks[3]))
    assert pool.published(blocks[0])


def test_released_again_moves_to_lru_tail():
    pool = K.BlockPool(2)
    a, b = pool.allocate(), pool.allocate()
    ka, kb = K.block_key(0, [1]), K.block_key(0, [2])
    pool.publish(a, ka)
    pool.publish(b, kb)
    pool.release(a)
    pool.release(b)
    assert pool.lookup(ka) == a   # a is used again...
    pool.release(a)               # ...and released after b: b is now the least recent
    assert pool.allocate() == b
    assert pool.lookup(ka) == a


def test_duplicate_publish_keeps_first():
    pool = K.BlockPool(3)
    a, b = pool.allocate(), pool.allocate()
    key = K.block_key(0, [7, 7])
    pool.publish(a, key)
    pool.publish(b, key)
    assert pool.published(a) and not pool.published(b)
    pool.publish(a, key)  # the same key again: no change
    assert pool.lookup(key) == a
    with pytest.raises(ValueError, match=f"block {a} is already published"):
        pool.publish(a, K.block_key(0, [8, 8]))


def test_unpublish_and_clear_cache():
    pool = K.BlockPool(3)
    a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
    for i, blk in enumerate((a, b, c)):
        pool.publish(blk, K.block_key(0, [i]))
    pool.unpublish(a)
    assert not pool.published(a) and pool.lookup(K.block_key(0, [0])) == -1
    pool.release(a)
    pool.release(b)
    pool.release(c)
    assert pool.stats()["n_free"] == 1 and pool.stats()["n_cached"] == 2
    pool.unpublish(b)  # a cached block unpublished becomes free
    assert pool.stats()["n_free"] == 2 and pool.stats()["n_cached"] == 1
    pool.clear_cache()
    s = pool.stats()
    assert (s["n_free"], s["n_cached"]) == (3, 0)
    assert pool.lookup(K.block_key(0, [2])) == -1


def test_pool_bad_inputs():
    pool = K.BlockPool(2)
    with pytest.raises(ValueError, match="block 0 is not in use"):
        pool.release(0)
    with pytest.raises(ValueError, match="block 1 is not in use"):
        pool.retain(1)
    with pytest.raises(ValueError, match="block 5 out of range"):
        pool.refs(5)
    with pytest.raises(ValueError, match="block -1 out of range"):
        pool.publish(-1, 1)
    with pytest.raises(ValueError, match="block 0 is not in use"):
        pool.publish(0, 1)
    with pytest.raises(ValueError, match="n_blocks must be > 0, got 0"):
        K.BlockPool(0)


def test_block_key_chaining_and_salt():
    toks = [5, 6, 7, 8]
    k = K.block_key(0, toks)
    assert k == K.block_key(0, toks), "deterministic"
    assert k != K.block_key(1, toks), "the parent matters"
    assert K.block_key(k, toks) != K.block_key(K.block_key(0, [5, 6, 7, 9]), toks)
    assert k != K.block_key(0, toks, salt=1), "the salt matters"
    assert K.block_key(0, toks, salt=1) != K.block_key(0, toks, salt=2)
    assert k != K.block_key(0, [8, 7, 6, 5]), "the order matters"
    assert K.block_key(0, [1, 2, 3]) != K.block_key(0, [1, 2, 3, 0]), "the length matters"
    assert K.block_key(0, [-1]) != K.block_key(0, [0xFFFF])
    # No collisions among many near-identical blocks (single-token and single-bit changes).
    keys = {K.block_key(p, [t, 0, t >> 3]) for p in range(8) for t in range(512)}
    keys |= {K.block_key(0, [1 << b]) for b in range(31)}
    assert len(keys) == 8 * 512 + 31


# --- KVCache -----------------------------------------------------------------------------------

def test_add_remove_has():
    kv = K.KVCache(8, 4)
    kv.add(1)
    kv.add(-7)
    assert kv.has(1) and kv.has(-7) and not kv.has(2) and kv.n_sequences == 2
    assert kv.n_tokens(1) == 0 and kv.blocks(1) == [] and kv.tokens(1) == []
    feed(kv, 1, [1, 2, 3, 4, 5])
    assert kv.stats()["n_used"] == 2
    kv.remove(1)
    kv.remove(1)  # unknown: no-op
    assert not kv.has(1) and kv.n_sequences == 1
    assert kv.stats()["n_used"] == 0


def test_reserve_across_block_boundaries():
    kv = K.KVCache(8, 4)
    kv.add(0)
    assert kv.blocks_needed(0, 0) == 0
    assert kv.blocks_needed(0, 1) == 1
    assert kv.blocks_needed(0, 4) == 1
    assert kv.blocks_needed(0, 5) == 2
    assert kv.reserve(0, 3)
    assert len(kv.blocks(0)) == 1 and kv.n_tokens(0) == 0
    # Reserved but not committed: the room is still there.
    assert kv.blocks_needed(0, 4) == 0 and kv.blocks_needed(0, 5) == 1
    kv.commit(0, [1, 2, 3])
    assert kv.blocks_needed(0, 1) == 0 and kv.blocks_needed(0, 2) == 1 and kv.blocks_needed(0, 10) == 3
    assert kv.reserve(0, 10)
    assert len(kv.blocks(0)) == 4 and kv.n_available == 4
    kv.commit(0, list(range(10, 20)))
    assert kv.n_tokens(0) == 13 and stored(kv, 0) == [1, 2, 3] + list(range(10, 20))
    assert len(set(kv.blocks(0))) == 4


def test_reserve_failure_leaves_nothing_allocated():
    kv = K.KVCache(4, 4)
    kv.add(0)
    kv.add(1)
    feed(kv, 0, list(range(6)))  # 2 blocks
    before = kv.stats()
    assert kv.blocks_needed(1, 9) == 3
    assert not kv.reserve(1, 9)
    assert kv.blocks(1) == [] and kv.stats() == before and kv.n_available == 2
    # Exactly what is available succeeds.
    assert kv.reserve(1, 8) and kv.n_available == 0


def test_commit_publishes_full_blocks_only():
    kv = K.KVCache(8, 4)
    kv.add(0)
    assert kv.reserve(0, 10)
    kv.commit(0, [1, 2, 3])
    assert not any(kv.published(b) for b in kv.blocks(0))
    kv.commit(0, [4, 5, 6, 7, 8, 9])
    b = kv.blocks(0)
    assert [kv.published(x) for x in b] == [True, True, False]
    kv.commit(0, [10])
    assert [kv.published(x) for x in b] == [True, True, False]
    assert kv.tokens(0) == list(range(1, 11)) and stored(kv, 0) == list(range(1, 11))


def test_commit_needs_reserve():
    kv = K.KVCache(8, 4)
    kv.add(3)
    with pytest.raises(ValueError, match=r"sequence 3: 2 tokens at position 0 exceed the 0 reserved"):
        kv.commit(3, [1, 2])
    assert kv.reserve(3, 2)
    with pytest.raises(ValueError, match=r"sequence 3: 5 tokens at position 0 exceed the 4 reserved"):
        kv.commit(3, [1, 2, 3, 4, 5])
    feed(kv, 3, [1, 2, 3, 4, 5])
    assert stored(kv, 3) == [1, 2, 3, 4, 5]


def test_match_prefix_longest_cached_prefix():
    bs = 4
    kv = K.KVCache(16, bs)
    prompt = list(range(100, 114))  # 14 tokens: 3 full blocks + 2
    kv.add(0)
    feed(kv, 0, prompt)
    kv.add(1)
    assert kv.match_prefix(1, prompt) == 12
    assert kv.blocks(1) == kv.blocks(0)[:3] and kv.tokens(1) == prompt[:12]
    assert all(kv.refs(b) == 2 for b in kv.blocks(0)[:3])
    # A prompt of exactly k full blocks matches k-1: the last token must be computed.
    kv.add(2)
    assert kv.match_prefix(2, prompt[:12]) == 8
    kv.add(3)
    assert kv.match_prefix(3, prompt[:13]) == 12
    # Stops at the first miss even if later blocks would match (keys chain their parents).
    kv.add(4)
    changed = prompt[:5] + [999] + prompt[6:]
    assert kv.match_prefix(4, changed) == 4 and kv.blocks(4) == kv.blocks(0)[:1]
    kv.add(5)
    assert kv.match_prefix(5, [7] + prompt[1:]) == 0 and kv.blocks(5) == []
    # Short prompts: nothing to match.
    kv.add(6)
    assert kv.match_prefix(6, prompt[:4]) == 0
    assert kv.match_prefix(6, []) == 0


def test_match_prefix_then_continue():
    kv = K.KVCache(16, 4)
    prompt = list(range(9))
    kv.add(0)
    feed(kv, 0, prompt)
    kv.add(1)
    m = kv.match_prefix(1, prompt)
    assert m == 8
    feed(kv, 1, prompt[m:] + [50, 51])
    assert kv.tokens(1) == prompt + [50, 51] and stored(kv, 1) == kv.tokens(1)
    assert kv.blocks(1)[:2] == kv.blocks(0)[:2] and kv.blocks(1)[2] != kv.blocks(0)[2]
    assert stored(kv, 0) == prompt, "the first sequence's partial block is untouched"


def test_same_prompt_after_remove_hits_cache():
    kv = K.KVCache(8, 4)
    prompt = list(range(30, 41))  # 11 tokens: 2 full blocks + 3
    kv.add(0)
    feed(kv, 0, prompt)
    full = kv.blocks(0)[:2]
    kv.remove(0)
    s = kv.stats()
    assert (s["n_used"], s["n_cached"], s["n_free"]) == (0, 2, 6)
    kv.add(1)
    assert kv.match_prefix(1, prompt) == 8
    assert kv.blocks(1) == full and stored(kv, 1) == prompt[:8]
    s = kv.stats()
    assert s["hits"] == 2 and s["n_cached"] == 0 and s["n_used"] == 2


def test_cache_survives_until_evicted_tail_first():
    kv = K.KVCache(3, 2)
    kv.add(0)
    feed(kv, 0, [1, 2, 3, 4, 5, 6])
    b = kv.blocks(0)
    kv.remove(0)   # released last block first: it is evicted first
    kv.add(1)
    assert kv.reserve(1, 2)
    assert kv.blocks(1) == [b[2]] and kv.stats()["evictions"] == 1
    kv.add(2)
    assert kv.match_prefix(2, [1, 2, 3, 4, 5, 6, 7]) == 4 and kv.blocks(2) == b[:2]


def test_truncate_releases_blocks_and_refuses_a_cut_inside_a_shared_block():
    bs = 4
    kv = K.KVCache(8, bs)
    prompt = list(range(1, 11))  # 10 tokens: 2 full + 2
    kv.add(0)
    feed(kv, 0, prompt)
    kv.add(1)
    assert kv.match_prefix(1, prompt) == 8
    shared = kv.blocks(1)
    assert all(kv.refs(b) == 2 for b in shared)
    before = (kv.stats(), kv.blocks(1), kv.tokens(1))
    with pytest.raises(ValueError, match=rf"sequence 1: position 5 falls inside block {shared[1]}, which 1 other "
                                         r"sequence\(s\) share; blocks are never copied, so truncate to a multiple "
                                         r"of block_size 4"):
        kv.truncate(1, 5)
    assert (kv.stats(), kv.blocks(1), kv.tokens(1)) == before and kv.published(shared[1])
    kv.truncate(1, 4)           # at a block boundary: the shared block 0 is only read
    assert kv.blocks(1) == shared[:1] and kv.refs(shared[1]) == 1 and kv.tokens(1) == prompt[:4]
    feed(kv, 1, [5])            # position 4: a new block
    assert kv.blocks(1)[1] not in shared and stored(kv, 1) == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="position 2 falls inside block"):
        kv.truncate(1, 2)
    kv.remove(0)                # block 0 is sequence 1's alone now: the cut goes in place
    kv.truncate(1, 2)
    assert kv.blocks(1) == shared[:1] and not kv.published(shared[0])
    feed(kv, 1, [77, 78])
    assert kv.blocks(1) == shared[:1] and stored(kv, 1) == [1, 2, 77, 78]
    assert kv.published(shared[0]), "full again: published under its new key"
    kv.add(2)
    assert kv.match_prefix(2, prompt) == 0, "the old key of block 0 is gone"
    kv.add(3)
    assert kv.match_prefix(3, [1, 2, 77, 78, 0]) == 4 and kv.blocks(3) == shared[:1]


def test_truncate_into_published_block_unpublishes_it():
    kv = K.KVCache(8, 4)
    kv.add(0)
    feed(kv, 0, list(range(8)))
    b0, b1 = kv.blocks(0)
    assert kv.published(b1) and kv.refs(b1) == 1
    kv.truncate(0, 6)
    # Its rows past the cut will be overwritten: nobody may map it by its old key meanwhile.
    assert kv.blocks(0) == [b0, b1] and not kv.published(b1) and kv.published(b0)
    kv.add(1)
    assert kv.match_prefix(1, list(range(8)) + [0]) == 4 and kv.blocks(1) == [b0]
    assert kv.refs(b1) == 1
    feed(kv, 0, [60, 70])
    assert kv.blocks(0) == [b0, b1] and kv.published(b1) and stored(kv, 0) == [0, 1, 2, 3, 4, 5, 60, 70]
    kv.add(2)
    assert kv.match_prefix(2, [0, 1, 2, 3, 4, 5, 60, 70, 9]) == 8


def test_truncate_drops_uncommitted_reservation():
    kv = K.KVCache(8, 4)
    kv.add(0)
    assert kv.reserve(0, 20)
    kv.commit(0, [1, 2, 3])
    assert len(kv.blocks(0)) == 5
    kv.truncate(0, 3)
    assert len(kv.blocks(0)) == 1 and kv.n_available == 7
    kv.truncate(0, 0)
    assert kv.blocks(0) == [] and kv.n_available == 8


def test_prefix_caching_off_never_hits():
    kv = K.KVCache(8, 4, prefix_caching=False)
    prompt = list(range(13))
    kv.add(0)
    feed(kv, 0, prompt)
    assert not any(kv.published(b) for b in kv.blocks(0))
    kv.add(1)
    assert kv.match_prefix(1, prompt) == 0
    kv.remove(0)
    s = kv.stats()
    assert (s["n_cached"], s["n_free"], s["lookups"], s["hits"]) == (0, 8, 0, 0)
    kv.add(2)
    assert kv.match_prefix(2, prompt) == 0


def test_salt_separates_caches():
    # Same pool, different salt (e.g. KV types): the blocks of one are not the other's.
    keys = [K.block_key(0, [1, 2], salt=s) for s in (0, 1, 2**63)]
    assert len(set(keys)) == 3
    kv = K.KVCache(8, 2, salt=5)
    kv.add(0)
    feed(kv, 0, [1, 2, 3])
    kv.add(1)
    assert kv.match_prefix(1, [1, 2, 3]) == 2


@pytest.mark.parametrize("call, message", [
    (lambda kv: kv.add(1), "sequence 1 already exists"),
    (lambda kv: kv.reserve(9, 1), "reserve: unknown sequence 9"),
    (lambda kv: kv.blocks_needed(9, 1), "blocks_needed: unknown sequence 9"),
    (lambda kv: kv.commit(9, [1]), "commit: unknown sequence 9"),
    (lambda kv: kv.truncate(9, 0), "truncate: unknown sequence 9"),
    (lambda kv: kv.n_tokens(9), "n_tokens: unknown sequence 9"),
    (lambda kv: kv.blocks(9), "blocks: unknown sequence 9"),
    (lambda kv: kv.tokens(9), "tokens: unknown sequence 9"),
    (lambda kv: kv.match_prefix(9, [1]), "match_prefix: unknown sequence 9"),
    (lambda kv: kv.match_prefix(1, [1, 2, 3]), r"sequence 1 is not empty \(3 tokens"),
    (lambda kv: kv.truncate(1, 4), r"sequence 1: n_tokens must be in \[0, 3\], got 4"),
    (lambda kv: kv.truncate(1, -1), r"sequence 1: n_tokens must be in \[0, 3\], got -1"),
    (lambda kv: kv.reserve(1, -2), "sequence 1: n must be >= 0, got -2"),
    (lambda kv: kv.blocks_needed(1, -2), "sequence 1: n must be >= 0, got -2"),
    (lambda kv: K.KVCache(8, 0), "block_size must be > 0, got 0"),
    (lambda kv: K.KVCache(-1, 4), "n_blocks must be > 0, got -1"),
])
def test_bad_inputs_raise_value_error(call, message):
    kv = K.KVCache(8, 4)
    kv.add(1)
    kv.add(2)
    feed(kv, 1, [1, 2, 3])
    before = (kv.stats(), kv.blocks(1), kv.tokens(1), kv.n_sequences)
    with pytest.raises(ValueError, match=message):
        call(kv)
    assert (kv.stats(), kv.blocks(1), kv.tokens(1), kv.n_sequences) == before


def test_match_prefix_on_reserved_sequence_raises():
    kv = K.KVCache(8, 4)
    kv.add(1)
    assert kv.reserve(1, 2)
    with pytest.raises(ValueError, match=r"sequence 1 is not empty \(0 tokens, 1 blocks\)"):
        kv.match_prefix(1, [1, 2, 3, 4, 5])


# --- HostTier ----------------------------------------------------------------------------------

def test_host_tier_take_prefers_free_slots_then_coldest_cached():
    h = K.HostTier(4)
    assert h.take(2) == [0, 1]
    assert h.store(100) == 2 and h.store(101) == 3
    assert h.stats() == dict(n_slots=4, n_used=2, n_cached=2, n_free=0, lookups=0, hits=0, stores=2)
    assert h.store(102) == 2, "full of owned slots but for two cached ones: the coldest is replaced"
    assert h.lookup(100) == -1 and h.lookup(101) == 3 and h.lookup(102) == 2
    h.end_step()
    # 101 was looked up before 102: it is now the colder of the two.
    assert h.take(1) == [3] and h.lookup(101) == -1 and h.n_available == 1
    assert h.take(2) == [], "fewer than asked for: nothing taken"
    assert h.stats()["n_used"] == 3 and h.stats()["n_cached"] == 1
    h.give_back(0)
    assert h.n_available == 2 and h.take(2) == [0, 2]


def test_host_tier_store_known_key_refreshes_it():
    h = K.HostTier(2)
    assert h.store(1) == 0 and h.store(2) == 1
    assert h.store(1) == -1, "cached already: no copy needed"
    assert h.store(3) == 1, "2 is now the coldest"
    assert h.lookup(1) == 0 and h.lookup(2) == -1
    s = h.stats()
    assert (s["stores"], s["lookups"], s["hits"]) == (3, 2, 1)


def test_host_tier_pins_last_until_end_of_step():
    h = K.HostTier(3)
    assert h.store(7) == 0 and h.store(8) == 1
    owned = h.take(1)
    assert owned == [2]
    assert h.lookup(7) == 0   # pinned: its bytes are still to be copied out
    assert h.n_available == 1
    assert h.store(9) == 1, "the pinned slot is skipped"
    assert h.store(10) == 1
    h.pin(2)
    h.give_back(2)
    assert h.n_available == 1 and h.take(2) == [], "a given-back slot that is pinned is not free yet"
    assert h.stats()["n_free"] == 1
    h.end_step()
    assert h.n_available == 3 and sorted(h.take(3)) == [0, 1, 2]


def test_host_tier_clear_cache():
    h = K.HostTier(3)
    assert h.store(1) == 0 and h.store(2) == 1
    assert h.lookup(1) == 0
    h.clear_cache()
    assert h.stats()["n_cached"] == 0 and h.lookup(2) == -1
    assert h.take(3) == [], "slot 0 stays pinned until the step ends"
    h.end_step()
    assert len(h.take(3)) == 3


@pytest.mark.parametrize("call, message", [
    (lambda h: K.HostTier(-1), "n_slots must be >= 0, got -1"),
    (lambda h: h.take(-1), "n must be >= 0, got -1"),
    (lambda h: h.give_back(1), "slot 1 is not owned"),
    (lambda h: h.give_back(4), r"slot 4 out of range \[0, 4\)"),
    (lambda h: h.pin(3), "slot 3 is free"),
    (lambda h: h.pin(-1), "out of range"),
])
def test_host_tier_bad_inputs(call, message):
    h = K.HostTier(4)
    h.take(1)
    with pytest.raises(ValueError, match=message):
        call(h)
    assert h.stats()["n_used"] == 1


# --- KVCache with a host tier ----------------------------------------------------------------------

def host_state(kv):
    s = kv.host_stats()
    return s["n_used"], s["n_cached"], s["n_free"]


def test_swap_out_and_back_keeps_the_bytes():
    kv = K.KVCache(6, 4, host_slots=4)
    tokens = list(range(10, 20))   # 2 full blocks + 2
    kv.add(0)
    feed(kv, 0, tokens)
    old = kv.blocks(0)
    assert kv.swap_out(0) and kv.swapped(0)
    assert kv.blocks(0) == [] and kv.tokens(0) == tokens and kv.n_tokens(0) == 10
    s = kv.stats()
    assert (s["n_used"], s["n_cached"]) == (0, 2), "its full blocks stay in the prefix cache"
    assert host_state(kv) == (3, 0, 1) and kv.host_copies_pending and kv.host_copies == []
    kv.flush_host_copies()
    assert kv.host_copies == [(True, list(zip(old, [0, 1, 2])))]
    assert [kv.host_content(i) for i in range(3)] == [tokens[:4], tokens[4:8], tokens[8:] + [-1, -1]]
    # Its cached full blocks count: mapping them back takes them off the pool's LRU list.
    assert kv.blocks_needed(0, 0) == 3 and kv.blocks_needed(0, 3) == 4
    kv.add(1)
    feed(kv, 1, list(range(100, 120)))   # 5 of the 6 blocks: its second block is evicted to the host
    assert kv.stats()["evictions"] == 1 and host_state(kv) == (3, 1, 0)
    assert kv.host_copies[-1] == (True, [(old[1], 3)])
    assert not kv.swap_in(0), "one block left"
    kv.remove(1)
    assert kv.swap_in(0) and not kv.swapped(0)
    assert kv.blocks(0)[0] == old[0], "its first block, still cached, is mapped back"
    # Its two new blocks evicted sequence 1's last two cached blocks to the host: into slot 0, given
    # back, and slot 3, the coldest cached one (slot 1, given back too, is still to be read).
    assert host_state(kv) == (0, 2, 2)
    kv.flush_host_copies()
    to_host, from_host = kv.host_copies[-2:]
    assert to_host[0] and [slot for _, slot in to_host[1]] == [0, 3]
    assert from_host == (False, [(1, kv.blocks(0)[1]), (2, kv.blocks(0)[2])])
    assert kv.host_content(0) == list(range(116, 120)) and kv.host_content(3) == list(range(112, 116))
    assert stored(kv, 0) == tokens
    assert all(kv.published(b) for b in kv.blocks(0)[:2]) and not kv.published(kv.blocks(0)[2])
    feed(kv, 0, [20, 21, 22])
    assert stored(kv, 0) == tokens + [20, 21, 22]


def test_swap_in_maps_blocks_still_cached_or_shared():
    kv = K.KVCache(8, 4, host_slots=8)
    prompt = list(range(12))
    kv.add(0)
    feed(kv, 0, prompt + [50])
    kv.add(1)
    assert kv.match_prefix(1, prompt + [60]) == 12
    feed(kv, 1, [60])
    shared = kv.blocks(1)[:3]
    assert kv.swap_out(1)
    kv.flush_host_copies()
    assert kv.blocks_needed(1, 1) == 1, "three blocks held by sequence 0, one new"
    assert kv.swap_in(1)
    assert kv.blocks(1)[:3] == shared and all(kv.refs(b) == 2 for b in shared)
    assert not kv.host_copies_pending or len(kv.host_copies) == 1
    kv.flush_host_copies()
    assert kv.host_copies[-1] == (False, [(3, kv.blocks(1)[3])]), "only the partial block is copied back"
    assert stored(kv, 1) == prompt + [60]


def test_swap_out_without_room_changes_nothing():
    kv = K.KVCache(8, 4, host_slots=2)
    kv.add(0)
    feed(kv, 0, list(range(9)))   # 3 blocks
    blocks = kv.blocks(0)
    assert not kv.swap_out(0)
    assert kv.blocks(0) == blocks and not kv.swapped(0) and host_state(kv) == (0, 0, 2)
    assert not kv.host_copies_pending
    plain = K.KVCache(8, 4)
    plain.add(0)
    feed(plain, 0, [1, 2])
    assert not plain.swap_out(0) and plain.host_stats() is None, "no host tier: never swapped"


def test_remove_of_a_swapped_sequence_frees_its_slots():
    kv = K.KVCache(8, 4, host_slots=4)
    kv.add(0)
    feed(kv, 0, list(range(6)))
    assert kv.swap_out(0)
    assert host_state(kv) == (2, 0, 2)
    kv.remove(0)
    assert not kv.has(0) and host_state(kv) == (0, 0, 4)
    kv.flush_host_copies()   # the queued copies into freed slots are harmless
    assert kv.stats()["n_used"] == 0


@pytest.mark.parametrize("call, message", [
    (lambda kv: kv.reserve(1, 1), "reserve: sequence 1 is swapped out"),
    (lambda kv: kv.commit(1, [5]), "commit: sequence 1 is swapped out"),
    (lambda kv: kv.truncate(1, 1), "truncate: sequence 1 is swapped out"),
    (lambda kv: kv.swap_out(1), "swap_out: sequence 1 is swapped out"),
    (lambda kv: kv.swap_in(2), "swap_in: sequence 2 is not swapped out"),
    (lambda kv: kv.swap_in(9), "swap_in: unknown sequence 9"),
])
def test_swapped_sequence_bad_inputs(call, message):
    kv = K.KVCache(8, 4, host_slots=4)
    kv.add(1)
    kv.add(2)
    feed(kv, 1, [1, 2, 3])
    assert kv.swap_out(1)
    before = (kv.stats(), kv.host_stats(), kv.tokens(1), kv.n_sequences)
    with pytest.raises(ValueError, match=message):
        call(kv)
    assert (kv.stats(), kv.host_stats(), kv.tokens(1), kv.n_sequences) == before


def test_evicted_prefix_blocks_come_back_from_the_host():
    kv = K.KVCache(4, 4, host_slots=8)
    prompt = list(range(8)) + [99]   # 2 full blocks + 1
    kv.add(0)
    feed(kv, 0, prompt)
    kv.remove(0)
    kv.add(1)
    feed(kv, 1, list(range(100, 116)))   # takes every block: the two cached ones are evicted
    assert kv.stats()["evictions"] == 2 and host_state(kv) == (0, 2, 6)
    kv.flush_host_copies()
    kv.remove(1)
    kv.add(2)
    assert kv.match_prefix(2, prompt) == 8
    assert kv.host_stats()["hits"] == 2 and kv.stats()["hits"] == 0
    assert all(kv.published(b) for b in kv.blocks(2)), "published again in the device cache"
    kv.flush_host_copies()
    assert stored(kv, 2) == prompt[:8]
    # Kept on the host as well: evicting them again copies nothing.
    hit_blocks = kv.blocks(2)
    kv.remove(2)
    kv.add(3)
    feed(kv, 3, list(range(200, 216)))
    assert kv.host_stats()["stores"] == 6, "only the two blocks of sequence 1 still on the device"
    assert not set(hit_blocks) & {block for block, _ in kv.host_copies[-1][1]}


def test_eviction_and_host_hit_in_one_flush_copy_in_order():
    # The block a host hit is copied into is one the prefix cache evicts to the host in the same
    # step: the copy out runs first.
    kv = K.KVCache(2, 2, host_slots=4)
    a, b = [1, 2, 3], [4, 5, 6, 7]
    kv.add(0)
    feed(kv, 0, a)
    kv.remove(0)                # [1, 2] cached
    kv.add(1)
    feed(kv, 1, b)              # evicts [1, 2] to host slot 0
    kv.remove(1)                # [6, 7] then [4, 5] cached
    kv.add(2)
    assert kv.match_prefix(2, a) == 2
    into = kv.blocks(2)[0]
    kv.flush_host_copies()
    assert kv.host_copies[-2:] == [(True, [(into, 1)]), (False, [(0, into)])]
    assert kv.host_content(1) == [6, 7] and stored(kv, 2) == [1, 2]
    kv.remove(2)                # [1, 2] cached on the device and on the host
    kv.add(3)
    assert kv.match_prefix(3, b + [8]) == 4, "[4, 5] from the device, [6, 7] from the host"
    assert kv.stats()["hits"] == 1 and kv.host_stats()["hits"] == 2
    assert kv.host_stats()["stores"] == 2, "evicting [1, 2] again copies nothing"
    kv.flush_host_copies()
    assert stored(kv, 3) == b


def test_block_filled_from_the_host_is_not_copied_out_before_it_lands():
    kv = K.KVCache(2, 2, host_slots=1)
    kv.add(0)
    feed(kv, 0, [1, 2, 3])
    kv.remove(0)
    kv.add(1)
    feed(kv, 1, [7, 8, 9])      # evicts [1, 2] to the host's only slot
    kv.flush_host_copies()
    kv.remove(1)                # [7, 8] cached
    kv.add(2)
    assert kv.match_prefix(2, [1, 2, 3]) == 2
    kv.remove(2)                # the hit's block is cached again, its bytes not there yet
    kv.add(3)
    assert kv.reserve(3, 4)     # evicts both: [7, 8] finds no free slot, the hit's block is skipped
    assert kv.host_stats()["stores"] == 1
    kv.flush_host_copies()
    assert kv.host_content(0) == [1, 2]


# --- randomized ----------------------------------------------------------------------------------

class Model:
    """What the cache must hold: each sequence's tokens. Refcounts follow from the block tables:
    a block's count is the number of table entries naming it."""

    def __init__(self, kv, n_blocks, bs):
        self.kv, self.n_blocks, self.bs = kv, n_blocks, bs
        self.seqs = {}
        self.swapped = set()   # sequences swapped out to the host tier: no blocks, a slot per block

    def check(self):
        kv, bs = self.kv, self.bs
        count = {}
        assert kv.n_sequences == len(self.seqs)
        for seq, toks in self.seqs.items():
            blocks = kv.blocks(seq)
            assert kv.tokens(seq) == toks and kv.n_tokens(seq) == len(toks)
            assert kv.swapped(seq) == (seq in self.swapped)
            if seq in self.swapped:
                assert blocks == []
                continue
            assert len(blocks) >= -(-len(toks) // bs)
            assert len(set(blocks)) == len(blocks), f"sequence {seq} names a block twice: {blocks}"
            assert stored(kv, seq) == toks, f"sequence {seq}'s KV was overwritten"
            for b in blocks:
                count[b] = count.get(b, 0) + 1
        s = kv.stats()
        for b in range(self.n_blocks):
            assert kv.refs(b) == count.get(b, 0), f"block {b}"
        cached = sum(1 for b in range(self.n_blocks) if b not in count and kv.published(b))
        assert (s["n_used"], s["n_cached"]) == (len(count), cached)
        assert s["n_used"] + s["n_cached"] + s["n_free"] == self.n_blocks
        assert kv.n_available == s["n_free"] + s["n_cached"]
        h = kv.host_stats()
        if h is not None:
            assert h["n_used"] == sum(-(-len(self.seqs[seq]) // bs) for seq in self.swapped)
            assert h["n_used"] + h["n_cached"] + h["n_free"] == h["n_slots"]


@pytest.mark.parametrize("bs, prefix_caching", [(1, True), (4, True), (16, True), (4, False)])
def test_random_sequences_against_model(bs, prefix_caching):
    rng = rng_for("kv_stress", bs, prefix_caching)
    n_blocks = 48
    kv = K.KVCache(n_blocks, bs, salt=3, prefix_caching=prefix_caching)
    model = Model(kv, n_blocks, bs)
    # Prompts share prefixes (a few bases plus random tails), so matches and shared blocks happen;
    # a sequence feeds the rest of its prompt (pending) before random tokens.
    bases = [rng.integers(0, 50, int(rng.integers(bs, 6 * bs + 2))).tolist() for _ in range(3)]
    pending = {}
    next_id = 0
    ops = dict(add=0, feed=0, truncate=0, refused=0, remove=0, full=0)

    def remove(seq):
        kv.remove(seq)
        del model.seqs[seq], pending[seq]
        ops["remove"] += 1

    for _ in range(1500):
        op = rng.choice(["add", "feed", "truncate", "remove", "clear"], p=[.17, .53, .15, .14, .01])
        seqs = list(model.seqs)
        pick = seqs[int(rng.integers(len(seqs)))] if seqs else None
        if op == "add" or not seqs:
            seq, next_id = next_id, next_id + 1
            kv.add(seq)
            base = bases[int(rng.integers(len(bases)))]
            prompt = (base[:int(rng.integers(0, len(base) + 1))]
                      + rng.integers(0, 50, int(rng.integers(0, 2 * bs))).tolist())
            m = kv.match_prefix(seq, prompt)
            assert m % bs == 0 and m <= max(len(prompt) - 1, 0)
            if not prefix_caching:
                assert m == 0
            model.seqs[seq], pending[seq] = prompt[:m], prompt[m:]
            ops["add"] += 1
        elif op == "feed":
            n = int(rng.integers(1, 3 * bs + 2))
            need, avail, blocks = kv.blocks_needed(pick, n), kv.n_available, kv.blocks(pick)
            ok = kv.reserve(pick, n)
            assert ok == (need <= avail)
            if ok:
                assert kv.n_available == avail - need
                k = int(rng.integers(0, n + 1))  # may commit less than reserved
                toks = (pending[pick] + rng.integers(0, 50, n).tolist())[:k]
                pending[pick] = pending[pick][k:]
                kv.commit(pick, toks)
                model.seqs[pick] = model.seqs[pick] + toks
                ops["feed"] += 1
            else:
                assert kv.blocks(pick) == blocks and kv.n_available == avail
                ops["full"] += 1
                remove(seqs[int(rng.integers(len(seqs)))])  # the scheduler's preemption
        elif op == "truncate":
            n = int(rng.integers(0, len(model.seqs[pick]) + 1))
            if n % bs and kv.refs(kv.blocks(pick)[n // bs]) > 1:
                with pytest.raises(ValueError, match="falls inside block"):
                    kv.truncate(pick, n)
                ops["refused"] += 1
            else:
                kv.truncate(pick, n)
                model.seqs[pick], pending[pick] = model.seqs[pick][:n], []
                ops["truncate"] += 1
        elif op == "remove":
            remove(pick)
        else:
            kv.clear_cache()
        model.check()
    s = kv.stats()
    print(ops, s)
    assert ops["feed"] > 300 and ops["truncate"] > 100 and ops["full"] > 0
    assert (ops["refused"] > 0) == (bs > 1 and prefix_caching), "only matched prefixes share blocks"
    if prefix_caching:
        assert s["hits"] > 0 and s["evictions"] > 0
    else:
        assert s["lookups"] == 0
    for seq in list(model.seqs):
        remove(seq)
    model.check()
    s = kv.stats()
    assert s["n_used"] == 0 and s["n_free"] + s["n_cached"] == n_blocks


@pytest.mark.parametrize("bs, host_slots", [(1, 24), (4, 12), (4, 40)])
def test_random_sequences_with_host_tier(bs, host_slots):
    """The engine's use of the cache: steps of sequences that grow, with prefix matches (device and
    host tier), preemption by swapping out (or removal when the tier is full), swaps back in and
    removals; the queued copies run once a step, before its writes."""
    rng = rng_for("kv_host_stress", bs, host_slots)
    n_blocks = 24
    kv = K.KVCache(n_blocks, bs, salt=5, host_slots=host_slots)
    model = Model(kv, n_blocks, bs)
    bases = [rng.integers(0, 50, int(rng.integers(2 * bs, 6 * bs + 2))).tolist() for _ in range(3)]
    pending = {}
    next_id = 0
    ops = dict(add=0, feed=0, swap_out=0, swap_in=0, recompute=0, remove=0)

    def remove(seq):
        kv.remove(seq)
        del model.seqs[seq], pending[seq]
        model.swapped.discard(seq)
        ops["remove"] += 1

    def covered():
        return ops["swap_out"] > 20 and ops["swap_in"] > 10 and kv.host_stats()["hits"] > 0

    # At least 1500 operations, and on until every path has run (a host-tier hit needs a prefix
    # that was evicted from the device pool but not from the tier: some draws take a while).
    for i in range(8000):
        if i >= 1500 and covered():
            break
        op = rng.choice(["add", "feed", "swap_in", "remove", "step"], p=[.15, .45, .15, .1, .15])
        resident = [q for q in model.seqs if q not in model.swapped]
        swapped = sorted(model.swapped)
        if op == "add" or not model.seqs:
            seq, next_id = next_id, next_id + 1
            kv.add(seq)
            base = bases[int(rng.integers(len(bases)))]
            prompt = (base[:int(rng.integers(0, len(base) + 1))]
                      + rng.integers(0, 50, int(rng.integers(0, 2 * bs))).tolist())
            m = kv.match_prefix(seq, prompt)
            assert m % bs == 0 and m <= max(len(prompt) - 1, 0)
            model.seqs[seq], pending[seq] = prompt[:m], prompt[m:]
            ops["add"] += 1
        elif op == "feed" and resident:
            pick = resident[int(rng.integers(len(resident)))]
            n = int(rng.integers(1, 2 * bs + 2))
            need, avail = kv.blocks_needed(pick, n), kv.n_available
            if kv.reserve(pick, n):
                kv.flush_host_copies()
                toks = (pending[pick] + rng.integers(0, 50, n).tolist())[:n]
                pending[pick] = pending[pick][n:]
                kv.commit(pick, toks)
                model.seqs[pick] = model.seqs[pick] + toks
                ops["feed"] += 1
            else:
                assert need > avail
                victim = resident[int(rng.integers(len(resident)))]
                if kv.swap_out(victim):
                    model.swapped.add(victim)
                    ops["swap_out"] += 1
                else:
                    remove(victim)
                    ops["recompute"] += 1
        elif op == "swap_in" and swapped:
            pick = swapped[int(rng.integers(len(swapped)))]
            need, avail = kv.blocks_needed(pick, 0), kv.n_available
            ok = kv.swap_in(pick)
            assert ok == (need <= avail)
            if ok:
                assert kv.n_available == avail - need
                model.swapped.discard(pick)
                ops["swap_in"] += 1
        elif op == "remove":
            seqs = list(model.seqs)
            remove(seqs[int(rng.integers(len(seqs)))])
        else:
            kv.flush_host_copies()
            model.check()
    kv.flush_host_copies()
    model.check()
    print(ops, kv.stats(), kv.host_stats())
    assert covered()
    for seq in list(model.seqs):
        remove(seq)
    model.check()
    h = kv.host_stats()
    assert kv.stats()["n_used"] == 0 and h["n_used"] == 0 and h["n_cached"] + h["n_free"] == host_slots
