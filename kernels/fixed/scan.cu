// Mamba-1 selective scan (selective_scan_ref of state-spaces/mamba): decode step, sequential burn-in forward,
// chunked parallel forward/backward and the fixed-order reductions of the backward's partials.
// Layouts: u, delta, z, y, du, ddelta, dz: [batch, d_inner, L] (T); B, C: [batch, d_state, L] (T);
// A_log: [d_inner, d_state] f32 (A = -exp(A_log)); D, delta_bias: [d_inner] f32; states: f32.
// Deterministic by construction: no atomics; every sum has one order fixed by lane/warp/chunk ids, and one
// warp owns one (batch, channel) row, so a row's result never depends on how many rows were launched.
// Contracts: kernels/fixed/scan.toml; float64 references: mamba_forge/references/scan.py.
#include "mf/common.cuh"
#include "mf/scan.cuh"
#include "mf/decode.cuh"

namespace mf {

// ---------------------------------------------------------------------------------------------------------
// Decode step: 4 lanes per (b, d) channel, each lane owns states n = 16*s + 4*q + j (slices of 16, j < 4);
// the C.h sum is a fixed butterfly over the 4 lanes. State [batch, d_inner, d_state] f32 updated in place.
// FUSED: dt' = softplus(dt + dt_bias); B, C gathered from the x_dbl row ([dt_rank | B | C]); out = y * silu(z).
// Plain: delta is dt' itself, B and C are [batch, d_state] f32 rows, no gate.
template <typename T, bool FUSED>
MF_DEVICE void ssm_step(T* __restrict__ out, float* __restrict__ state, const T* __restrict__ u, const T* __restrict__ dt,
                        const float* __restrict__ dt_bias, const float* __restrict__ A_log, const T* __restrict__ Bm,
                        const T* __restrict__ Cm, const float* __restrict__ Dp, const T* __restrict__ z, int batch,
                        int d_inner, int d_state, int bc_offset, int bc_stride) {
  const long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long ch = gid >> 2;
  const int q = (int)(gid & 3);
  const bool valid = ch < (long long)batch * d_inner && d_state <= MF_STATE_CAP;
  const long long b = valid ? ch / d_inner : 0;
  const int d = valid ? (int)(ch % d_inner) : 0;
  // Latency-bound at small batch: every load is issued before the first arithmetic that needs a loaded value
  // (dt' is computed after the slice's loads, z and D are loaded up front), so a step costs one memory round
  // trip instead of three (dt -> state/A/B/C -> z). The arithmetic and its order are unchanged.
  float uv = 0.f, dt_raw = 0.f, bias = 0.f, Dd = 0.f, zv = 0.f;
  if (valid) {
    uv = to_f32(u[ch]);
    dt_raw = to_f32(dt[ch]);
    Dd = Dp[d];
    if (FUSED) {
      bias = dt_bias[d];
      zv = to_f32(z[ch]);
    }
  }
  // FUSED: B at row b, columns [bc_offset, bc_offset + d_state), C right after; plain: bc_offset = 0.
  const T* Brow = Bm + b * bc_stride + bc_offset;
  const T* Crow = Cm + b * bc_stride + bc_offset + (FUSED ? d_state : 0);
  const float* arow = A_log + (long long)d * d_state;
  float* srow = state + ch * d_state;
  float acc = 0.f;
  const int nslices = (d_state + 15) >> 4;
  for (int s = 0; s < nslices; ++s) {
    const int n0 = 16 * s + 4 * q;
    float h[4], al[4], bn[4], cn[4];
    const bool vec = valid && n0 + 4 <= d_state && aligned16(srow + n0);
    if (vec) {
      const float4 v = *reinterpret_cast<const float4*>(srow + n0);
      h[0] = v.x; h[1] = v.y; h[2] = v.z; h[3] = v.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) h[j] = (valid && n0 + j < d_state) ? srow[n0 + j] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool in = valid && n0 + j < d_state;
      al[j] = in ? arow[n0 + j] : 0.f;
      bn[j] = in ? to_f32(Brow[n0 + j]) : 0.f;
      cn[j] = in ? to_f32(Crow[n0 + j]) : 0.f;
    }
    const float dtv = FUSED ? softplus(dt_raw + bias) : dt_raw;
    const float dtu = dtv * uv;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (valid && n0 + j < d_state) {
        const float a2 = -expf(al[j]) * kLog2e;
        h[j] = scan_exp2(dtv * a2) * h[j] + dtu * bn[j];
        acc += cn[j] * h[j];
      }
    }
    if (vec) {
      *reinterpret_cast<float4*>(srow + n0) = make_float4(h[0], h[1], h[2], h[3]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (valid && n0 + j < d_state) srow[n0 + j] = h[j];
    }
  }
  // Fixed butterfly over the channel's 4 lanes (a + b == b + a bitwise, so all 4 lanes agree).
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  if (valid && q == 0) {
    float y = acc + Dd * uv;
    if (FUSED) y *= silu(zv);
    out[ch] = from_f32<T>(y);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Sequential (burn-in) forward: one warp per (b, d) channel, lane owns states n = lane + 32*k (k < KS), the
// per-timestep C.h sum is warp_sum (fixed butterfly). `state` holds h0 on entry and the final state on exit.
// SAVE: saved[b, d, c, n] = the state before timestep c*256 (c < ceil(L/256)), what the backward recomputes from.
template <typename T, bool SAVE>
MF_DEVICE void ssm_burnin(T* __restrict__ out, float* __restrict__ state, float* __restrict__ saved, const T* __restrict__ u,
                          const T* __restrict__ delta, const float* __restrict__ A_log, const T* __restrict__ Bm,
                          const T* __restrict__ Cm, const float* __restrict__ Dp, const T* __restrict__ z,
                          const float* __restrict__ delta_bias, int batch, int d_inner, int d_state, long long L,
                          int softplus_flag) {
  constexpr int KS = (MF_STATE_CAP + 31) / 32;
  const int lane = threadIdx.x & 31;
  const long long ch = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (ch >= (long long)batch * d_inner || d_state > MF_STATE_CAP) return;  // whole warp
  const auto [b, d, row, bc, bias, Dd] = scan_channel(ch, d_inner, d_state, L, delta_bias, Dp);
  const long long nsaved = (L + kScanSaveChunk - 1) / kScanSaveChunk;
  float h[KS], a2[KS];
#pragma unroll
  for (int k = 0; k < KS; ++k) {
    const int n = lane + 32 * k;
    h[k] = n < d_state ? state[ch * d_state + n] : 0.f;
    a2[k] = n < d_state ? -expf(A_log[(long long)d * d_state + n]) * kLog2e : 0.f;
  }
  for (long long l0 = 0; l0 < L; l0 += 32) {
    const long long t = l0 + lane;
    const float ut = t < L ? to_f32(u[row + t]) : 0.f;
    const float dt = t < L ? to_f32(delta[row + t]) : 0.f;
    const int steps = (int)min(32LL, L - l0);
    float yv = 0.f;
    for (int j = 0; j < steps; ++j) {
      const long long l = l0 + j;
      if (SAVE && l % kScanSaveChunk == 0) {
#pragma unroll
        for (int k = 0; k < KS; ++k)
          if (lane + 32 * k < d_state) saved[(ch * nsaved + l / kScanSaveChunk) * d_state + lane + 32 * k] = h[k];
      }
      const float uj = __shfl_sync(0xffffffffu, ut, j);
      const float dj = scan_delta(__shfl_sync(0xffffffffu, dt, j), bias, softplus_flag);
      const float dju = dj * uj;
      float acc = 0.f;
#pragma unroll
      for (int k = 0; k < KS; ++k) {
        const int n = lane + 32 * k;
        if (n < d_state) {
          h[k] = scan_exp2(dj * a2[k]) * h[k] + dju * to_f32(Bm[bc + n * L + l]);
          acc += to_f32(Cm[bc + n * L + l]) * h[k];
        }
      }
      const float y = warp_sum(acc) + Dd * uj;
      if (lane == j) yv = y;
    }
    if (t < L) {
      if (z) yv *= silu(to_f32(z[row + t]));
      out[row + t] = from_f32<T>(yv);
    }
  }
#pragma unroll
  for (int k = 0; k < KS; ++k)
    if (lane + 32 * k < d_state) state[ch * d_state + lane + 32 * k] = h[k];
}

// ---------------------------------------------------------------------------------------------------------
// Chunked parallel forward: one warp per (b, d) channel; a chunk of 32*NI timesteps, NI consecutive per lane.
// For each state n (outer loop, so no per-state registers): a_i = exp(delta'_i A_n), b_i = delta'_i u_i B_n,i;
// each lane folds its NI affine maps, a warp scan (fixed order) gives every lane its incoming state, the lane
// replays its items, y_i += C_n,i h_i. The chunk carry per n lives in shared memory (one row per warp).
// SAVE: saved[b, d, s, n] = the state before timestep 256 s, written by the lanes whose items start there (lane 0
// writes the chunk's incoming carry itself); the chunk may span several 256-step strides. last_state: final state.
template <typename T, int NI, bool SAVE>
MF_DEVICE void ssm_parallel_fwd(T* __restrict__ out, float* __restrict__ last_state, float* __restrict__ saved,
                                const T* __restrict__ u, const T* __restrict__ delta, const float* __restrict__ A_log,
                                const T* __restrict__ Bm, const T* __restrict__ Cm, const float* __restrict__ Dp,
                                const T* __restrict__ z, const float* __restrict__ delta_bias, int batch, int d_inner,
                                int d_state, long long L, int softplus_flag, float* __restrict__ carry) {
  static_assert(!SAVE || (kScanSaveChunk % NI == 0 && (32 * NI) % kScanSaveChunk == 0),
                "saved-state boundaries must fall on lane starts");
  constexpr int CH = 32 * NI;
  const int lane = threadIdx.x & 31;
  const long long ch = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (ch >= (long long)batch * d_inner || d_state > MF_STATE_CAP) return;  // whole warp
  const auto [b, d, row, bc, bias, Dd] = scan_channel(ch, d_inner, d_state, L, delta_bias, Dp);
  const long long nchunks = (L + CH - 1) / CH;
  const long long nsaved = (L + kScanSaveChunk - 1) / kScanSaveChunk;
  for (int n = lane; n < d_state; n += 32) carry[n] = 0.f;
  __syncwarp();
  for (long long c = 0; c < nchunks; ++c) {
    const long long l0 = c * CH + (long long)lane * NI;
    float dl[NI], dlu[NI], y[NI];
    load_items<T, NI>(delta + row, l0, L, dl);
    load_items<T, NI>(u + row, l0, L, dlu);
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      // Past L: delta' = 0 makes (a, b) = (1, 0), the identity, so padding never moves the state.
      const float dv = l0 + i < L ? scan_delta(dl[i], bias, softplus_flag) : 0.f;
      y[i] = Dd * dlu[i];
      dl[i] = dv;
      dlu[i] = dv * dlu[i];
    }
    for (int n = 0; n < d_state; ++n) {
      const float a2 = -expf(A_log[(long long)d * d_state + n]) * kLog2e;
      float bv[NI], a[NI];
      load_items<T, NI>(Bm + bc + n * L, l0, L, bv);
      float pa = 1.f, hb = 0.f;
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        a[i] = scan_exp2(dl[i] * a2);
        bv[i] = dlu[i] * bv[i];
        hb = a[i] * hb + bv[i];
        pa = pa * a[i];
      }
      warp_scan_affine_fwd(pa, hb, lane);
      const float hstart = carry[n];
      float ea = __shfl_up_sync(0xffffffffu, pa, 1), eb = __shfl_up_sync(0xffffffffu, hb, 1);
      if (lane == 0) { ea = 1.f; eb = 0.f; }
      const float next = __shfl_sync(0xffffffffu, pa, 31) * hstart + __shfl_sync(0xffffffffu, hb, 31);
      float h = ea * hstart + eb;  // the state before this lane's first item
      if (SAVE && (lane * NI) % kScanSaveChunk == 0) {
        const long long s_idx = (c * CH + (long long)lane * NI) / kScanSaveChunk;
        if (s_idx < nsaved) saved[(ch * nsaved + s_idx) * d_state + n] = lane == 0 ? hstart : h;
      }
      float cv[NI];
      load_items<T, NI>(Cm + bc + n * L, l0, L, cv);
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        h = a[i] * h + bv[i];
        y[i] += cv[i] * h;
      }
      __syncwarp();
      if (lane == 0) carry[n] = next;
      __syncwarp();
    }
    if (z) {
      float zv[NI];
      load_items<T, NI>(z + row, l0, L, zv);
#pragma unroll
      for (int i = 0; i < NI; ++i) y[i] *= silu(zv[i]);
    }
    store_items<T, NI>(out + row, l0, L, y);
  }
  __syncwarp();
  if (last_state)
    for (int n = lane; n < d_state; n += 32) last_state[ch * d_state + n] = carry[n];
}

// A lane's 8 staged items of one channel (TOK): two 16-byte shared-memory reads, or writes.
MF_DEVICE void fold_tok_items(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
// Stage p[0 .. K) (zero from `len` on) as f32 into column threadIdx.x of K rows of kScanSaveChunk.
template <typename T, int K>
MF_DEVICE void fold_tok_stage(float (*rows)[kScanSaveChunk], const T* __restrict__ p, int len) {
  float v[K];
  load_items<T, K>(p, 0, len < 0 ? 0 : len, v);
#pragma unroll
  for (int j = 0; j < K; ++j) rows[j][threadIdx.x] = v[j];
}
MF_DEVICE void fold_tok_put(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// ---------------------------------------------------------------------------------------------------------
// Chunked backward: W warps per block, one (b, d) channel per warp, W consecutive channels of one batch element
// (d_inner % W == 0). Chunks of 256 timesteps (8 per lane) run last to first; per chunk and state n the warp
// recomputes the forward from saved[b, d, c, n], then runs the reverse recurrence q_i = a_i (C_i dy_i + q_{i+1})
// (g_i = C_i dy_i + q_{i+1} = dL/dh_i) as a suffix warp scan. Per-d contributions to dB/dC go through shared
// memory and are folded over the W warps in warp order: dB_part/dC_part[b, d / W, n, l].
// dA_part[b, d, n] (w.r.t. A), dD_part[b, d], dbias_part[b, d] (w.r.t. delta_bias): fixed-order per-channel sums.
// LOCAL: the chunk of a longer sequence: dh_last[b, d, n] is dL/dh at the last timestep's output state,
// dh0[b, d, n] receives dL/dh0 (h0 = saved[b, d, 0, :]).
// TOK: token-major operands, the layouts the layer's GEMMs and token scan use, so the training backward needs no
// transposes: u, delta, dout, du, ddelta are [batch * L, d_inner] rows; z and dz rows z_ld apart (z = xz[:, d:] read
// and dz written into dxz's second half in place); B and C rows bc_ld apart (x_dbl's columns). Each chunk goes
// through shared memory (FoldTokSmem): thread t loads timestep 256c + t's W channels (a 16-byte vector for 16-bit
// T) and its B, C rows, then every warp reads its channel's 8 items a lane, as from a channel-major row; the
// chunk's du, ddelta, dz go back the same way. Same arithmetic in the same order as the channel-major kernel.
constexpr int kFoldTokState = 16;  // the staged B, C span: d_state <= 16 (Mamba-1's 16)
template <int W> struct FoldTokSmem {
  float io[4][W][kScanSaveChunk];  // u, delta, dout, z; then du, ddelta, (dout kept), dz
  float bc[2][kFoldTokState][kScanSaveChunk];
};
static_assert(sizeof(FoldTokSmem<8>) == (4 * 8 + 2 * 16) * 256 * 4, "scan.toml's launch.dynamic_smem of the fold");

template <typename T, int W, bool LOCAL, bool TOK = false>
MF_DEVICE void ssm_scan_bwd(T* __restrict__ du, T* __restrict__ ddelta, T* __restrict__ dz, float* __restrict__ dB_part,
                            float* __restrict__ dC_part, float* __restrict__ dA_part, float* __restrict__ dD_part,
                            float* __restrict__ dbias_part, float* __restrict__ dh0, const T* __restrict__ dout,
                            const float* __restrict__ saved, const float* __restrict__ dh_last, const T* __restrict__ u,
                            const T* __restrict__ delta, const float* __restrict__ A_log, const T* __restrict__ Bm,
                            const T* __restrict__ Cm, const float* __restrict__ Dp, const T* __restrict__ z,
                            const float* __restrict__ delta_bias, int batch, int d_inner, int d_state, long long L,
                            int softplus_flag, long long z_ld = 0, long long bc_ld = 0,
                            FoldTokSmem<W>* __restrict__ tok = nullptr) {
  constexpr int NI = 8, CH = 32 * NI;
  static_assert(CH == kScanSaveChunk, "the backward's chunk is the saved-state stride");
  static_assert(!TOK || W == 8, "TOK: a thread stages one timestep's 8 channels");
  __shared__ float qcarry[W][MF_STATE_CAP];
  // Double-buffered: state n writes contrib[buf] while the fold of state n-1 may still read contrib[buf ^ 1], so
  // one block barrier per state suffices (a buffer is rewritten only after the next barrier, which every thread
  // reaches after finishing its fold of that buffer).
  // 16-byte aligned: each lane writes its 8 items as two float4 (scalar stores at a 32-byte lane stride were
  // 8-way bank conflicts).
  alignas(16) __shared__ float contrib[2][W][2][CH];
  int buf = 0;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  // Block-uniform exits only (the block synchronizes below).
  if (d_state > (TOK ? kFoldTokState : MF_STATE_CAP) || d_inner % W != 0 ||
      (long long)blockIdx.x * W >= (long long)batch * d_inner)
    return;
  const long long ch = (long long)blockIdx.x * W + w;
  const auto [b, d, row, bc, bias, Dd] = scan_channel(ch, d_inner, d_state, L, delta_bias, Dp);
  const long long groups = d_inner / W, g = d / W;
  const long long nchunks = (L + CH - 1) / CH;
  for (int n = lane; n < d_state; n += 32) qcarry[w][n] = LOCAL ? dh_last[ch * d_state + n] : 0.f;
  __syncwarp();
  float dD_acc = 0.f, dbias_acc = 0.f;
  // TOK: the block's first channel d0 = d - w, and timestep row r of the sequence (b * L + r)
  const long long d0 = (long long)d - w, seq = b * L;
  for (long long c = nchunks - 1; c >= 0; --c) {
    const long long l0 = c * CH + (long long)lane * NI;
    float uv[NI], dl[NI], dy[NI], zv[NI], y[NI], dsum_u[NI], ddl[NI], raw[NI];
    if constexpr (TOK) {
      // thread t stages timestep c CH + t (zero past L); the barrier before also ends the last chunk's stores
      const long long l = c * CH + threadIdx.x, r = seq + l;
      const int len = l < L ? W : 0, nlen = l < L ? d_state : 0;
      __syncthreads();
      fold_tok_stage<T, W>(tok->io[0], u + r * d_inner + d0, len);
      fold_tok_stage<T, W>(tok->io[1], delta + r * d_inner + d0, len);
      fold_tok_stage<T, W>(tok->io[2], dout + r * d_inner + d0, len);
      fold_tok_stage<T, W>(tok->io[3], z + r * z_ld + d0, z ? len : 0);
#pragma unroll
      for (int h = 0; h < kFoldTokState; h += 8) {
        fold_tok_stage<T, 8>(&tok->bc[0][h], Bm + r * bc_ld + h, nlen - h);
        fold_tok_stage<T, 8>(&tok->bc[1][h], Cm + r * bc_ld + h, nlen - h);
      }
      __syncthreads();
      fold_tok_items(&tok->io[0][w][lane * NI], uv);
      fold_tok_items(&tok->io[1][w][lane * NI], raw);
      fold_tok_items(&tok->io[2][w][lane * NI], dy);
      fold_tok_items(&tok->io[3][w][lane * NI], zv);
    } else {
      load_items<T, NI>(u + row, l0, L, uv);
      load_items<T, NI>(delta + row, l0, L, raw);
      load_items<T, NI>(dout + row, l0, L, dy);
      if (z) load_items<T, NI>(z + row, l0, L, zv);
    }
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      dl[i] = l0 + i < L ? scan_delta(raw[i], bias, softplus_flag) : 0.f;
      if (z) dy[i] *= silu(zv[i]);  // dL/dy; zero past L (dout loads as 0 there)
      y[i] = Dd * uv[i];
      dsum_u[i] = Dd * dy[i];
      ddl[i] = 0.f;
    }
    for (int n = 0; n < d_state; ++n) {
      const float an = -expf(A_log[(long long)d * d_state + n]);
      const float a2 = an * kLog2e;
      float bv[NI], cv[NI], a[NI], bb[NI], h[NI];
      if constexpr (TOK) {
        fold_tok_items(&tok->io[0][w][lane * NI], uv);  // re-read each state: u not live across the loop
        fold_tok_items(&tok->bc[0][n][lane * NI], bv);
        fold_tok_items(&tok->bc[1][n][lane * NI], cv);
      } else {
        load_items<T, NI>(Bm + bc + n * L, l0, L, bv);
        load_items<T, NI>(Cm + bc + n * L, l0, L, cv);
      }
      // Issued here, used after the scans: their global latency overlaps the arithmetic instead of stalling the
      // warp (and so the block barrier) at the end of the state's work.
      const float hstart = saved[(ch * nchunks + c) * d_state + n];
      const float dA_prev = (lane == 0 && c != nchunks - 1) ? dA_part[ch * d_state + n] : 0.f;
      // Forward replay inside the chunk (same operations as ssm_parallel_fwd).
      float pa = 1.f, hb = 0.f;
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        a[i] = scan_exp2(dl[i] * a2);
        bb[i] = (dl[i] * uv[i]) * bv[i];
        hb = a[i] * hb + bb[i];
        pa = pa * a[i];
      }
      warp_scan_affine_fwd(pa, hb, lane);
      float ea = __shfl_up_sync(0xffffffffu, pa, 1), eb = __shfl_up_sync(0xffffffffu, hb, 1);
      if (lane == 0) { ea = 1.f; eb = 0.f; }
      const float hin = ea * hstart + eb;
      float hc = hin;
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        hc = a[i] * hc + bb[i];
        h[i] = hc;
        y[i] += cv[i] * hc;
      }
      // Reverse recurrence: lane-local suffix maps x -> s + q x, then a suffix warp scan.
      float sq = 1.f, ss = 0.f;
#pragma unroll
      for (int i = NI - 1; i >= 0; --i) {
        ss = a[i] * (cv[i] * dy[i] + ss);
        sq = a[i] * sq;
      }
      warp_scan_affine_rev(sq, ss, lane);
      const float qc = qcarry[w][n];
      float nq = __shfl_down_sync(0xffffffffu, sq, 1), ns = __shfl_down_sync(0xffffffffu, ss, 1);
      if (lane == 31) { nq = 1.f; ns = 0.f; }
      const float carry_out = __shfl_sync(0xffffffffu, ss, 0) + __shfl_sync(0xffffffffu, sq, 0) * qc;
      float qn = ns + nq * qc;  // q at the first item of the next lane
      float dA_acc = 0.f, cb[NI], cc[NI];
#pragma unroll
      for (int i = NI - 1; i >= 0; --i) {
        const float gi = cv[i] * dy[i] + qn;  // dL/dh_i
        const float hp = i > 0 ? h[i - 1] : hin;
        const float gd = gi * dl[i];
        dsum_u[i] += gd * bv[i];
        ddl[i] += gi * (an * a[i] * hp + bv[i] * uv[i]);
        dA_acc += gd * a[i] * hp;
        cb[i] = gd * uv[i];
        cc[i] = dy[i] * h[i];
        qn = a[i] * gi;
        if (i % 4 == 0) {  // items i..i+3 done: store them now (short live ranges)
          reinterpret_cast<float4*>(&contrib[buf][w][0][lane * NI + i])[0] = make_float4(cb[i], cb[i + 1], cb[i + 2], cb[i + 3]);
          reinterpret_cast<float4*>(&contrib[buf][w][1][lane * NI + i])[0] = make_float4(cc[i], cc[i + 1], cc[i + 2], cc[i + 3]);
        }
      }
      static_assert(NI % 4 == 0, "float4 stores of the contributions");
      const float dA_sum = warp_sum(dA_acc);
      if (lane == 0) dA_part[ch * d_state + n] = dA_prev + dA_sum;  // dA_prev = 0 on the first (last) chunk
      __syncwarp();
      if (lane == 0) qcarry[w][n] = carry_out;
      __syncthreads();
      // Fold the W channels' dB/dC contributions in warp order.
      for (int t = threadIdx.x; t < CH; t += 32 * W) {
        const long long l = c * CH + t;
        if (l < L) {
          float sb = 0.f, sc = 0.f;
#pragma unroll
          for (int ww = 0; ww < W; ++ww) {
            sb += contrib[buf][ww][0][t];
            sc += contrib[buf][ww][1][t];
          }
          const long long k = ((b * groups + g) * d_state + n) * L + l;
          dB_part[k] = sb;
          dC_part[k] = sc;
        }
      }
      buf ^= 1;
    }
    float dzv[NI], ddv[NI];
    if constexpr (TOK) {  // re-read from the stage: not live in registers across the state loop (128 a thread)
      fold_tok_items(&tok->io[0][w][lane * NI], uv);
      fold_tok_items(&tok->io[1][w][lane * NI], raw);
      fold_tok_items(&tok->io[3][w][lane * NI], zv);
    }
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const bool in = l0 + i < L;
      ddv[i] = in ? ddl[i] * scan_delta_grad(raw[i], bias, softplus_flag) : 0.f;
      dD_acc += dy[i] * uv[i];
      dbias_acc += ddv[i];
      dzv[i] = 0.f;
    }
    if (z && dz) {
      float dov[NI];
      if constexpr (TOK) fold_tok_items(&tok->io[2][w][lane * NI], dov);
      else load_items<T, NI>(dout + row, l0, L, dov);
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        const float s = sigmoid(zv[i]);
        dzv[i] = dov[i] * y[i] * (s * (1.f + zv[i] * (1.f - s)));
      }
      if constexpr (!TOK) store_items<T, NI>(dz + row, l0, L, dzv);
    }
    if constexpr (TOK) {
      // each warp writes its own channel's items (slots it alone read), then thread t stores timestep c CH + t
      fold_tok_put(&tok->io[0][w][lane * NI], dsum_u);
      fold_tok_put(&tok->io[1][w][lane * NI], ddv);
      fold_tok_put(&tok->io[3][w][lane * NI], dzv);
      __syncthreads();
      const long long l = c * CH + threadIdx.x, r = seq + l;
      if (l < L) {
        float v[W];
#pragma unroll
        for (int k = 0; k < 3; ++k) {
          T* dst = k == 0 ? du + r * d_inner + d0 : k == 1 ? ddelta + r * d_inner + d0 : (z && dz) ? dz + r * z_ld + d0 : nullptr;
          if (!dst) continue;
#pragma unroll
          for (int j = 0; j < W; ++j) v[j] = tok->io[k == 2 ? 3 : k][j][threadIdx.x];
          store_items<T, W>(dst, 0, W, v);
        }
      }
    } else {
      store_items<T, NI>(du + row, l0, L, dsum_u);
      store_items<T, NI>(ddelta + row, l0, L, ddv);
    }
  }
  const float dD_sum = warp_sum(dD_acc), dbias_sum = warp_sum(dbias_acc);
  if (lane == 0) {
    dD_part[ch] = dD_sum;
    dbias_part[ch] = dbias_sum;
  }
  __syncwarp();
  if (LOCAL)
    for (int n = lane; n < d_state; n += 32) dh0[ch * d_state + n] = qcarry[w][n];
}

// ---------------------------------------------------------------------------------------------------------
// Reductions of the backward's partials, each in one fixed order.
// out[b, n, l] = sum_{g = 0..G-1} part[b, g, n, l] (ascending g).
template <typename T>
MF_DEVICE void ssm_reduce_bc(T* __restrict__ out, const float* __restrict__ part, int batch, int groups, long long nl) {
  const long long total = (long long)batch * nl, stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    const long long b = i / nl, r = i % nl;
    const float* p = part + b * groups * nl + r;
    float s = 0.f;
    // Unrolled so 8 independent loads are in flight per thread (the adds stay in ascending g): the partials are
    // hundreds of MB and this loop is bound by bytes in flight.
#pragma unroll 8
    for (int g = 0; g < groups; ++g) s += p[g * nl];
    out[i] = from_f32<T>(s);
  }
}

// out[b, l, n] = sum_g part[b, g, n, l]: 32x32 tiles through shared memory (coalesced reads and writes).
// Block (32, 8); grid (ceil(L/32), ceil(N/32), batch).
template <typename T>
MF_DEVICE void ssm_reduce_bc_tmajor(T* __restrict__ out, const float* __restrict__ part, int batch, int groups, int d_state,
                                    long long L, float (*tile)[33]) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const long long l0 = (long long)blockIdx.x * 32;
  const int n0 = blockIdx.y * 32;
  const long long b = blockIdx.z;
  if (b >= batch) return;
  const long long nl = (long long)d_state * L;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int n = n0 + ty + 8 * k;
    const long long l = l0 + tx;
    float s = 0.f;
    if (n < d_state && l < L) {
      const float* p = part + b * groups * nl + (long long)n * L + l;
      for (int g = 0; g < groups; ++g) s += p[g * nl];
    }
    tile[ty + 8 * k][tx] = s;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const long long l = l0 + ty + 8 * k;
    const int n = n0 + tx;
    if (n < d_state && l < L) out[(b * L + l) * d_state + n] = from_f32<T>(tile[tx][ty + 8 * k]);
  }
}

// The reference library's fused dB + dC reduction of per-channel locals: dB[b, t, n] = sum_{d = 0..D-1}
// dB_local[..d..] in ascending d, one f32 chain from +0 with every local promoted T -> f32 (dC the same), both
// outputs [batch, L, d_state] f32, =-stored (no memset precondition). Two input layouts, the same chain, so the
// same bits: [b][t][d][n] (n fastest: a thread per output, neighbours read neighbouring n) and the t-major
// [b][n][d][t] (the parallel route's tape layout: 32x32 (t, n) tiles, the sums read along t and transposed
// through shared memory so the [b][t][n] stores are coalesced too).
template <typename T>
MF_DEVICE float sum_locals(const T* __restrict__ p, int d_inner, long long stride) {
  float s = 0.f;
#pragma unroll 8
  for (int d = 0; d < d_inner; ++d) s += to_f32(p[d * stride]);  // 8 loads in flight, adds in ascending d
  return s;
}

template <typename T>
MF_DEVICE void ssm_reduce_dbc_fused(float* __restrict__ dB, float* __restrict__ dC, const T* __restrict__ dB_local,
                                    const T* __restrict__ dC_local, int batch, long long L, int d_inner, int d_state) {
  const long long total = (long long)batch * L * d_state, stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    const long long bt = i / d_state, n = i % d_state;
    const long long base = bt * d_inner * d_state + n;
    dB[i] = sum_locals(dB_local + base, d_inner, d_state);
    dC[i] = sum_locals(dC_local + base, d_inner, d_state);
  }
}

// Block (32, 8); grid (ceil(L/32), ceil(d_state/32), batch).
template <typename T>
MF_DEVICE void ssm_reduce_dbc_fused_tmajor(float* __restrict__ dB, float* __restrict__ dC, const T* __restrict__ dB_local,
                                           const T* __restrict__ dC_local, int batch, long long L, int d_inner,
                                           int d_state, float (*tile)[33]) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const long long t0 = (long long)blockIdx.x * 32;
  const int n0 = blockIdx.y * 32;
  const long long b = blockIdx.z;
  if (b >= batch) return;  // uniform per block
#pragma unroll 1
  for (int which = 0; which < 2; ++which) {
    const T* __restrict__ local = which == 0 ? dB_local : dC_local;
    float* __restrict__ out = which == 0 ? dB : dC;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int n = n0 + ty + 8 * k;
      const long long t = t0 + tx;
      float s = 0.f;
      if (n < d_state && t < L) s = sum_locals(local + (b * d_state + n) * d_inner * L + t, d_inner, L);
      tile[ty + 8 * k][tx] = s;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const long long t = t0 + ty + 8 * k;
      const int n = n0 + tx;
      if (n < d_state && t < L) out[(b * L + t) * d_state + n] = tile[tx][ty + 8 * k];
    }
    __syncthreads();  // the tile is rewritten for dC
  }
}

// out[i] = sum_{r = 0..rows-1} part[r * width + i] (ascending r), then times -exp(A_log[i]) when A_log is given.
MF_DEVICE void ssm_reduce_rows(float* __restrict__ out, const float* __restrict__ part, const float* __restrict__ A_log,
                               long long rows, long long width) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < width; i += stride) {
    float s = 0.f;
    for (long long r = 0; r < rows; ++r) s += part[r * width + i];
    out[i] = A_log ? -expf(A_log[i]) * s : s;
  }
}

// ---- kernel bodies: each symbol's extern "C" wrapper is generated from kernels/fixed/scan.toml (its params and
// bounds: mamba_forge/catalog/wrappers.py) and calls the body its family names, with every parameter in order:
// ssm_burnin, ssm_scan_bwd, ssm_reduce_dbc_fused, ssm_reduce_bc and ssm_reduce_rows above, or one of these, which
// fill in what a family does not take (nullptr for an output it does not save, a block's shared tile).

// The unfused step: B, C rows of their own (offset 0, stride d_state), no dt bias, no gate.
template <typename T>
MF_DEVICE void ssm_step_forward(T* y, float* state, const T* u, const T* delta, const float* A_log, const T* Bm,
                                const T* Cm, const float* Dp, int batch, int d_inner, int d_state) {
  ssm_step<T, false>(y, state, u, delta, nullptr, A_log, Bm, Cm, Dp, nullptr, batch, d_inner, d_state, 0, d_state);
}

// The fused decode step and its candidates (mf::ssm_step_v, kernels/include/mf/decode.cuh): LANES threads per
// channel, ROWS batch rows per thread; B and C both read from the x_dbl row. Then (Dp, z, batch, d_inner, d_state,
// dt_rank, x_dbl_stride, z_stride). PDL_BLOCKS: the catalog's pdl_max_blocks (grids it may be launched early on).
template <typename T, int LANES, int ROWS, int PDL_BLOCKS, typename... Rest>
MF_DEVICE void ssm_step_fused(T* out, float* state, const T* u, const T* dt, const float* dt_bias, const float* A_log,
                              const T* x_dbl, Rest... rest) {
  ssm_step_v<T, LANES, ROWS, true, PDL_BLOCKS>(out, state, u, dt, dt_bias, A_log, x_dbl, x_dbl, rest...);
}

// The fused step on a 16-bit state (T, as mamba-ssm's inference cache keeps it by default): the same arithmetic in
// f32 on the state read as T, the new state rounded to T; half the state bytes of the f32 step (the decode step's
// traffic at large batch).
template <typename T, int LANES, int ROWS, int PDL_BLOCKS, typename... Rest>
MF_DEVICE void ssm_step_fused_state16(T* out, T* state, const T* u, const T* dt, const float* dt_bias,
                                      const float* A_log, const T* x_dbl, Rest... rest) {
  ssm_step_v<T, LANES, ROWS, true, PDL_BLOCKS, T>(out, state, u, dt, dt_bias, A_log, x_dbl, x_dbl, rest...);
}

// ssm_burnin without the saved states; then (u, delta, A_log, Bm, Cm, Dp, z, delta_bias, batch, d_inner, d_state,
// L, delta_softplus).
template <typename T, typename... Rest>
MF_DEVICE void ssm_burnin_nosave(T* out, float* state, Rest... rest) {
  ssm_burnin<T, false>(out, state, nullptr, rest...);
}

// 4 blocks (16 warps) per SM (scan.toml bounds): caps registers at 128, enough to hold the 16-item tiles without
// spilling. 512-step chunks like the nosave variant (half the warp scans per item of 256-step chunks); the saving
// one saves every 256. Each warp's carry row is in the block's shared tile.
template <typename T, typename... Args>
MF_DEVICE void ssm_parallel_scan_fwd(Args... args) {  // (out, last_state, saved, u, ..., delta_softplus)
  __shared__ float carry[4][MF_STATE_CAP];
  ssm_parallel_fwd<T, 16, true>(args..., carry[threadIdx.x >> 5]);
}
template <typename T, typename... Rest>
MF_DEVICE void ssm_parallel_scan_fwd_nosave(T* out, float* last_state, Rest... rest) {  // then (u, ..., delta_softplus)
  __shared__ float carry[4][MF_STATE_CAP];
  ssm_parallel_fwd<T, 16, false>(out, last_state, nullptr, rest..., carry[threadIdx.x >> 5]);
}

// The parallel backward of W warps, without dh0 or dh_last (the local backward, ssm_scan_bwd<T, 4, true>, takes
// both). Blocks per SM (scan.toml bounds): W = 4: 3 (<= 168 registers, 12 warps; 128 registers would spill). W = 8
// on sm_90 and newer: 2 blocks cap registers at 128 without spilling, 16 warps per SM instead of the 8 that ~166
// registers allowed; sm_80's ptxas spills at 128, so there it keeps 1 block.
template <typename T, int W>
MF_DEVICE void ssm_parallel_scan_bwd(T* du, T* ddelta, T* dz, float* dB_part, float* dC_part, float* dA_part,
                                     float* dD_part, float* dbias_part, const T* dout, const float* saved, const T* u,
                                     const T* delta, const float* A_log, const T* Bm, const T* Cm, const float* Dp,
                                     const T* z, const float* delta_bias, int batch, int d_inner, int d_state,
                                     long long L, int delta_softplus) {
  ssm_scan_bwd<T, W, false>(du, ddelta, dz, dB_part, dC_part, dA_part, dD_part, dbias_part, nullptr, dout, saved,
                            nullptr, u, delta, A_log, Bm, Cm, Dp, z, delta_bias, batch, d_inner, d_state, L,
                            delta_softplus);
}

// Token-major (the training backward's layouts, no transposes): FoldTokSmem in dynamic shared memory (64 KiB,
// scan.toml's launch), W = 8, d_state <= 16.
template <typename T, int W>
MF_DEVICE void ssm_parallel_scan_bwd_tokens(T* du, T* ddelta, T* dz, float* dB_part, float* dC_part, float* dA_part,
                                            float* dD_part, float* dbias_part, const T* dout, const float* saved,
                                            const T* u, const T* delta, const float* A_log, const T* Bm, const T* Cm,
                                            const float* Dp, const T* z, const float* delta_bias, int batch,
                                            int d_inner, int d_state, long long L, long long z_ld, long long bc_ld,
                                            int delta_softplus) {
  MF_DYNAMIC_SMEM(fold_tok_smem_raw);
  ssm_scan_bwd<T, W, false, true>(du, ddelta, dz, dB_part, dC_part, dA_part, dD_part, dbias_part, nullptr, dout,
                                  saved, nullptr, u, delta, A_log, Bm, Cm, Dp, z, delta_bias, batch, d_inner,
                                  d_state, L, delta_softplus, z_ld, bc_ld,
                                  reinterpret_cast<FoldTokSmem<W>*>(fold_tok_smem_raw));
}

// The time-major reductions transpose through a block's 32 x 33 shared tile.
template <typename T, typename... Args>
MF_DEVICE void ssm_reduce_dbc_fused_tmajor_body(Args... args) {  // (dB, dC, dB_local, dC_local, batch, L, d_inner, d_state)
  __shared__ float tile[32][33];
  ssm_reduce_dbc_fused_tmajor<T>(args..., tile);
}
template <typename T, typename... Args>
MF_DEVICE void ssm_reduce_bc_tmajor_body(Args... args) {  // (out, part, batch, groups, d_state, L)
  __shared__ float tile[32][33];
  ssm_reduce_bc_tmajor<T>(args..., tile);
}

// dD[d] = sum_b part[b, d] (also used for d delta_bias).
MF_DEVICE void ssm_reduce_d_D(float* out, const float* part, int batch, int d_inner) {
  ssm_reduce_rows(out, part, nullptr, batch, d_inner);
}

// dA_log[d, n] = -exp(A_log[d, n]) * sum_{k, b} part[k, b, d, n] (k = training chunk, ascending; then b). The
// single-chunk family, dA_log[d, n] = -exp(A_log[d, n]) * sum_b part[b, d, n], is ssm_reduce_rows itself.
MF_DEVICE void ssm_reduce_d_a_log_chunks(float* out, const float* part, const float* A_log, int nchunks, int batch,
                                         long long dn) {
  ssm_reduce_rows(out, part, A_log, (long long)nchunks * batch, dn);
}

}  // namespace mf
