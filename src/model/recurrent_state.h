// RecurrentState: the state slots of a hybrid model's recurrent layers (RecurrentLayer), one set
// per sequence the caller runs at once, allocated on each layer's backend and cleared per slot.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "ember/model.h"

namespace ember {

bool has_recurrent_layers(const HParams& hp);
bool is_recurrent_layer(const HParams& hp, int32_t l);

// Floats of one slot of a recurrent layer's convolution state and its delta-rule (gated DeltaNet) or
// selective-scan (Mamba2, whose shapes mamba2_common.h maps onto the same ssm_* fields) state.
int64_t conv_state_floats(const HParams& hp);
int64_t ssm_state_floats(const HParams& hp);

class RecurrentState {
public:
    RecurrentState() = default;
    RecurrentState(const RecurrentState&) = delete;
    RecurrentState& operator=(const RecurrentState&) = delete;
    ~RecurrentState();
    // n_slots slots of every recurrent layer l on backends[l] (zeroed); none for a model without them.
    void allocate(const HParams& hp, const std::vector<Backend*>& backends, int32_t n_slots);
    // Layer l's slots; null for an attention layer.
    const RecurrentLayer* layer(int32_t l) const;
    // Zeroes slot `slot` of every layer: the state of a sequence that has seen no token.
    void clear(int32_t slot);
    // Slot `slot` of every layer (conv then DeltaNet state, layer by layer) copied to host memory,
    // and written back from such a copy: a prefix's state kept to resume from.
    std::vector<float> save(int32_t slot) const;
    void restore(int32_t slot, const std::vector<float>& saved);
    // Floats of one slot over all layers (the size of save's copy).
    int64_t slot_floats() const;
    int32_t n_slots() const { return n_slots_; }

private:
    std::vector<RecurrentLayer> layers_;   // [n_layer]; conv null for attention layers
    std::vector<Backend*> backends_;
    int32_t n_slots_ = 0;
};

}  // namespace ember
