// Mamba2 layers (mamba2_common.h).
#include "model/arch/mamba2_common.h"

#include "backend/ssm_scan.h"
#include "ember/status.h"

namespace ember {

namespace {

SsmShape shape_of(const HParams& hp) { return {hp.ssm_v_heads, hp.ssm_head_v, hp.ssm_head_k, hp.ssm_k_heads}; }

}  // namespace

void read_mamba2_hparams(const GGUFFile& f, HParams& hp) {
    const std::string a = hp.arch + ".";
    const int64_t kernel = (int64_t)f.get_uint(a + "ssm.conv_kernel");
    const int64_t d_state = (int64_t)f.get_uint(a + "ssm.state_size");
    const int64_t n_group = (int64_t)f.get_uint(a + "ssm.group_count");
    const int64_t n_head = (int64_t)f.get_uint(a + "ssm.time_step_rank");
    const int64_t inner = (int64_t)f.get_uint(a + "ssm.inner_size");
    if (kernel <= 1 || d_state <= 0 || n_group <= 0 || n_head <= 0 || inner <= 0 || inner % n_head != 0 ||
        n_head % n_group != 0)
        fail(f.path(), ": ", a, "ssm.* must be positive, conv_kernel above 1, inner_size (", inner,
             ") a multiple of time_step_rank (", n_head, ") and that of group_count (", n_group, "); conv_kernel ",
             kernel, ", state_size ", d_state);
    hp.ssm_conv_kernel = (int32_t)kernel;
    hp.ssm_k_heads = (int32_t)n_group;
    hp.ssm_v_heads = (int32_t)n_head;
    hp.ssm_head_k = (int32_t)d_state;
    hp.ssm_head_v = (int32_t)(inner / n_head);
}

std::vector<TensorSpec> mamba2_tensors(const HParams& hp) {
    const SsmShape s = shape_of(hp);
    const int64_t E = hp.n_embd, I = s.inner(), C = s.xbc_width(), H = s.n_head;
    const int64_t all = I + C + H;   // ssm_in's rows: z, then x B C, then dt
    std::vector<TensorSpec> t = {
        {Role::ssm_gate, "ssm_in.weight", {E, I}, false, false, {0, all}},
        {Role::ssm_in, "ssm_in.weight", {E, C}, false, false, {I, all}},
        {Role::ssm_alpha, "ssm_in.weight", {E, H}, false, false, {I + C, all}},
        {Role::ssm_conv, "ssm_conv1d.weight", {hp.ssm_conv_kernel, C}, false, true},
        {Role::ssm_conv_b, "ssm_conv1d.bias", {C}, true},
        {Role::ssm_dt, "ssm_dt.bias", {H}},
        {Role::ssm_a, "ssm_a", {1, H}, false, true},
        {Role::ssm_d, "ssm_d", {1, H}, false, true},
        {Role::ssm_norm, "ssm_norm.weight", {I / s.n_group, s.n_group}, false, true},
        {Role::ssm_out, "ssm_out.weight", {I, E}},
    };
    return t;
}

int64_t mamba2_scratch_floats(const HParams& hp) {
    const SsmShape s = shape_of(hp);
    return 2 * s.inner() + 2 * s.xbc_width() + s.n_head;
}

void mamba2_mixer(const BlockRun& r, float* out) {
    const SsmShape s = shape_of(r.hp);
    const int32_t n = r.n_tok, K = r.hp.ssm_conv_kernel;
    const int64_t I = s.inner(), C = s.xbc_width(), H = s.n_head;
    if (!r.buf.recurrent) fail(r.hp.arch, ": a Mamba2 layer needs BlockBuffers::recurrent (mamba2_scratch_floats)");
    float* z = r.buf.recurrent;
    float* xbc = z + (int64_t)n * I;
    float* dt = xbc + (int64_t)n * C;
    float* conv = dt + (int64_t)n * H;
    float* y = conv + (int64_t)n * C;
    const Weight* ws[3] = {r.w.m(Role::ssm_gate), r.w.m(Role::ssm_in), r.w.m(Role::ssm_alpha)};
    float* ys[3] = {z, xbc, dt};
    r.be.matmul_many(ws, ys, 3, r.buf.xn, n);
    const BatchInfo& b = *r.batch;
    // Each run of one sequence's tokens, in order, through its slot.
    for (int32_t t0 = 0; t0 < n;) {
        int32_t t1 = t0 + 1;
        while (t1 < n && b.seq[t1] == b.seq[t0]) ++t1;
        const int32_t len = t1 - t0, slot = b.state_slot[b.seq[t0]];
        r.be.short_conv(&xbc[t0 * C], r.w.v(Role::ssm_conv), r.w.v(Role::ssm_conv_b), len, (int32_t)C, K, true,
                        r.state->conv_of(slot), &conv[t0 * C]);
        r.be.ssm_scan(&conv[t0 * C], &dt[t0 * H], r.w.v(Role::ssm_a), r.w.v(Role::ssm_dt), r.w.v(Role::ssm_d), len, s,
                      r.state->ssm_of(slot), &y[t0 * I]);
        t0 = t1;
    }
    r.be.gated_act(Activation::SiLU, z, y, (int64_t)n * I, y);
    r.be.rmsnorm_grouped(y, r.w.v(Role::ssm_norm), n, I, s.n_group, r.hp.rms_eps, y);
    r.be.matmul(*r.w.m(Role::ssm_out), y, n, out);
}

}  // namespace ember
