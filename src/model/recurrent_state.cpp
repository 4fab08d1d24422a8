// The state slots of hybrid models' recurrent layers (recurrent_state.h).
#include "model/recurrent_state.h"

#include "backend/short_conv.h"
#include "ember/status.h"

namespace ember {

bool has_recurrent_layers(const HParams& hp) {
    for (bool r : hp.recurrent_layer)
        if (r) return true;
    return false;
}

bool is_recurrent_layer(const HParams& hp, int32_t l) {
    return l < (int32_t)hp.recurrent_layer.size() && hp.recurrent_layer[l];
}

int64_t conv_state_floats(const HParams& hp) {
    const int32_t channels = 2 * hp.ssm_k_heads * hp.ssm_head_k + hp.ssm_v_heads * hp.ssm_head_v;
    return short_conv_state_floats(channels, hp.ssm_conv_kernel);
}

int64_t ssm_state_floats(const HParams& hp) { return (int64_t)hp.ssm_v_heads * hp.ssm_head_k * hp.ssm_head_v; }

RecurrentState::~RecurrentState() {
    for (size_t l = 0; l < layers_.size(); ++l) {
        if (!layers_[l].conv) continue;
        backends_[l]->free(layers_[l].conv);
        backends_[l]->free(layers_[l].ssm);
    }
}

void RecurrentState::allocate(const HParams& hp, const std::vector<Backend*>& backends, int32_t n_slots) {
    if (!layers_.empty()) fail("RecurrentState: already allocated");
    if (n_slots < 0) fail("RecurrentState: n_slots must be >= 0, got ", n_slots);
    layers_.resize(hp.n_layer);
    backends_ = backends;
    n_slots_ = n_slots;
    if (n_slots == 0) return;
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        if (!is_recurrent_layer(hp, l)) continue;
        RecurrentLayer& r = layers_[l];
        r.conv_floats = conv_state_floats(hp);
        r.ssm_floats = ssm_state_floats(hp);
        r.n_slots = n_slots;
        r.conv = static_cast<float*>(backends[l]->alloc((size_t)n_slots * r.conv_floats * sizeof(float)));
        r.ssm = static_cast<float*>(backends[l]->alloc((size_t)n_slots * r.ssm_floats * sizeof(float)));
    }
    for (int32_t s = 0; s < n_slots; ++s) clear(s);
}

int64_t RecurrentState::slot_floats() const {
    int64_t n = 0;
    for (const RecurrentLayer& r : layers_)
        if (r.conv) n += r.conv_floats + r.ssm_floats;
    return n;
}

std::vector<float> RecurrentState::save(int32_t slot) const {
    if (slot < 0 || slot >= n_slots_) fail("RecurrentState: slot ", slot, " out of range [0, ", n_slots_, ")");
    std::vector<float> out((size_t)slot_floats());
    float* at = out.data();
    for (size_t l = 0; l < layers_.size(); ++l) {
        const RecurrentLayer& r = layers_[l];
        if (!r.conv) continue;
        backends_[l]->copy_to_host(at, r.conv_of(slot), r.conv_floats * sizeof(float));
        at += r.conv_floats;
        backends_[l]->copy_to_host(at, r.ssm_of(slot), r.ssm_floats * sizeof(float));
        at += r.ssm_floats;
    }
    return out;
}

void RecurrentState::restore(int32_t slot, const std::vector<float>& saved) {
    if (slot < 0 || slot >= n_slots_) fail("RecurrentState: slot ", slot, " out of range [0, ", n_slots_, ")");
    if ((int64_t)saved.size() != slot_floats())
        fail("RecurrentState: a saved state of ", saved.size(), " floats for slots of ", slot_floats());
    const float* at = saved.data();
    for (size_t l = 0; l < layers_.size(); ++l) {
        const RecurrentLayer& r = layers_[l];
        if (!r.conv) continue;
        backends_[l]->copy_from_host(r.conv_of(slot), at, r.conv_floats * sizeof(float));
        at += r.conv_floats;
        backends_[l]->copy_from_host(r.ssm_of(slot), at, r.ssm_floats * sizeof(float));
        at += r.ssm_floats;
    }
}

const RecurrentLayer* RecurrentState::layer(int32_t l) const {
    return l < (int32_t)layers_.size() && layers_[l].conv ? &layers_[l] : nullptr;
}

void RecurrentState::clear(int32_t slot) {
    if (slot < 0 || slot >= n_slots_) fail("RecurrentState: slot ", slot, " out of range [0, ", n_slots_, ")");
    for (size_t l = 0; l < layers_.size(); ++l) {
        const RecurrentLayer& r = layers_[l];
        if (!r.conv) continue;
        const std::vector<float> zeros(std::max(r.conv_floats, r.ssm_floats), 0.0f);
        backends_[l]->copy_from_host(r.conv_of(slot), zeros.data(), r.conv_floats * sizeof(float));
        backends_[l]->copy_from_host(r.ssm_of(slot), zeros.data(), r.ssm_floats * sizeof(float));
    }
}

}  // namespace ember
