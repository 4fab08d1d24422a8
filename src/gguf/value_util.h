// Helpers shared by the GGUF reader and writer: on-disk sizes and range rules of value types.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ember/gguf.h"

namespace ember {

// True for the 13 value type ids of GGUF v2/v3 (0..12).
bool gguf_type_valid(uint32_t t);
// Bytes a scalar of this type occupies in the file; 0 for STRING and ARRAY (variable size).
size_t gguf_scalar_size(GGUFType t);
// Smallest number of bytes one value of this type can occupy (STRING: its u64 length;
// ARRAY: element type u32 + count u64). Used to reject counts the file cannot hold.
size_t gguf_min_value_size(GGUFType t);
bool gguf_type_signed(GGUFType t);

inline bool gguf_is_pow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace ember
