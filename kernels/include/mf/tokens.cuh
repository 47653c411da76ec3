// Token-major sequence kernels of a Mamba-1 layer (kernels/fixed/tokens.toml): the selective scan and the causal
// conv1d over [batch, L, channels] rows, the layouts the layer's GEMMs produce, so prefill reads what in_proj and
// x_proj wrote (xz [batch*L, 2*d_inner]: x = xz[:, :d_inner], z = xz[:, d_inner:]; x_dbl [batch*L, dt_rank+2N])
// with no transposes and no copies. Decode is the same kernels at L = 1.
//
// Why one kernel for prefill and decode: a token scored by prefill and one produced by decode must get the same
// bits (RL fine-tuning compares them; chunked prefill and prefix caches mix them). Each kernel here walks time in
// order per channel, from the state it is given, with the per-element arithmetic of the decode steps
// (ssm_step_forward_fused: mf/decode.cuh at LANES = 2; conv1d_step_forward_silu: conv1d.cu), so
//   scan(L) == L successive scan(1) == L successive ssm_step_forward_fused, and likewise for the conv,
// bit for bit, for any split of L into chunks (the states carry everything). The GPU tests and the qualifier's
// agreement check prove both equalities.
#pragma once
#include "mf/common.cuh"
#include "mf/conv.cuh"
#include "mf/decode.cuh"
#include "mf/scan.cuh"

namespace mf {

// ---- the selective scan --------------------------------------------------------------------------------------
// Block: kTokChannels channels x 2 lanes (lane q of channel c is thread 2c + q, as LANES = 2 of the step); grid x
// over channel blocks, y over batch rows (strided past 65535). Lane q owns the states n = 16 s + 4 (q + 2 k) + j
// (slice s, chunk k < 2, j < 4) in registers for the whole sequence. Inputs are staged per tile of kTokSteps
// timesteps in shared memory (f32), the next tile's loads in flight in registers while this one is computed.
// The per-(timestep, channel) values that do not depend on the state (dt' = softplus(dt + dt_bias), dt' u,
// silu(z)) are computed once per element while staging, by the thread that stages it, with the step's own
// expressions, so the bits are the step's; the step loop keeps only the exponentials and the state's fma chain
// (the transcendental chain of softplus and silu made most of a step's latency, computed by both lanes).
//
// Per timestep, exactly the step's operations in the step's order:
//   dt' = softplus(dt + dt_bias), dtu = dt' u; per state: h = fma(2^(dt' a2), h, dtu B), a2 = -2^(A_log log2e +
//   log2(log2e)); per chunk p = C0 h0, then p = fma(Cj, hj, p); per slice acc += p0 + p1 (slices in order, acc
//   from 0); acc += the other lane's acc (a + b == b + a); y = fma(D, u, acc) silu(z).
// States past d_state (in the last slice) hold 0 and meet B = C = 0, as the step's scalar path loads them.
constexpr int kTokChannels = 64;
constexpr int kTokThreads = 2 * kTokChannels;
constexpr int kTokSteps = 16;
constexpr int kTokRowVals = kTokSteps * kTokChannels / kTokThreads;         // u, dt, z values per thread per tile
constexpr int kTokBCVals = kTokSteps * 2 * MF_STATE_CAP / kTokThreads;     // B, C values per thread per tile

struct TokScanSmem {
  // u (for D u), dt' = softplus(dt + dt_bias), dt' u, silu(z); staged without deriving (more than 16 states),
  // dtv holds the raw dt and sz the raw z, and dtu is unused
  float u[2][kTokSteps][kTokChannels], dtv[2][kTokSteps][kTokChannels], dtu[2][kTokSteps][kTokChannels];
  float sz[2][kTokSteps][kTokChannels];
  float bc[2][kTokSteps][2 * MF_STATE_CAP];  // [l][n] = B, [l][MF_STATE_CAP + n] = C; 0 past d_state
};
static_assert(sizeof(TokScanSmem) <= 48 * 1024, "TokScanSmem: static shared memory is capped at 48 KiB");

template <typename T> struct TokScanTile {
  float u[kTokRowVals], dt[kTokRowVals], z[kTokRowVals], bc[kTokBCVals];
};

// This thread's share of tile l0 (timesteps l0 .. l0 + kTokSteps of row b), as f32 (0 outside the sequence or the
// channels): issued together so the tile costs one memory round trip.
template <typename T>
MF_DEVICE void tok_scan_load(TokScanTile<T>& r, const T* __restrict__ u, const T* __restrict__ dt,
                             const T* __restrict__ xz, const T* __restrict__ x_dbl, long long b, long long L,
                             long long l0, int d0, int d_inner, int d_state, int dt_rank, int x_dbl_stride) {
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < kTokRowVals; ++i) {
    const int e = t + i * kTokThreads;
    const int l = e / kTokChannels, c = e % kTokChannels;
    const bool ok = l0 + l < L && d0 + c < d_inner;
    const long long row = b * L + l0 + l;
    r.u[i] = ok ? to_f32(u[row * d_inner + d0 + c]) : 0.f;
    r.dt[i] = ok ? to_f32(dt[row * d_inner + d0 + c]) : 0.f;
    r.z[i] = ok ? to_f32(xz[row * 2 * d_inner + d_inner + d0 + c]) : 0.f;
  }
#pragma unroll
  for (int i = 0; i < kTokBCVals; ++i) {
    const int e = t + i * kTokThreads;
    const int l = e / (2 * MF_STATE_CAP), k = e % (2 * MF_STATE_CAP);
    const int n = k < MF_STATE_CAP ? k : k - MF_STATE_CAP;  // B columns first, then C
    const bool ok = l0 + l < L && n < d_state;
    const long long row = b * L + l0 + l;
    r.bc[i] = ok ? to_f32(x_dbl[row * x_dbl_stride + dt_rank + (k < MF_STATE_CAP ? 0 : d_state) + n]) : 0.f;
  }
}

// bias: dt_bias of this thread's staging channel (e % kTokChannels == threadIdx.x % kTokChannels for every i).
// Two passes over this thread's own elements: the raw values first (the next tile's registers die), then the
// derived ones from shared memory (no barrier: a thread reads back only what it wrote). Computed from the
// registers instead, eight softplus and silu chains beside the live state and the loads spilled (ptxas: 255
// registers, 36-80 bytes of spill).
// DERIVE false (more than 16 states, where the registers are full): the raw dt and z stay, the loop derives them.
template <typename T, bool DERIVE>
MF_DEVICE void tok_scan_stage(const TokScanTile<T>& r, TokScanSmem& s, int buf, float bias) {
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < kTokRowVals; ++i) {
    const int e = t + i * kTokThreads;
    const int l = e / kTokChannels, c = e % kTokChannels;
    s.u[buf][l][c] = r.u[i];
    s.dtv[buf][l][c] = r.dt[i];
    s.sz[buf][l][c] = r.z[i];
  }
#pragma unroll
  for (int i = 0; i < kTokBCVals; ++i) {
    const int e = t + i * kTokThreads;
    s.bc[buf][e / (2 * MF_STATE_CAP)][e % (2 * MF_STATE_CAP)] = r.bc[i];
  }
  if (!DERIVE) return;
#pragma unroll
  for (int i = 0; i < kTokRowVals; ++i) {
    const int e = t + i * kTokThreads;
    const int l = e / kTokChannels, c = e % kTokChannels;
    const float dtv = softplus(s.dtv[buf][l][c] + bias);  // the step's expressions (mf/decode.cuh, FUSED)
    s.dtv[buf][l][c] = dtv;
    s.dtu[buf][l][c] = dtv * s.u[buf][l][c];
    s.sz[buf][l][c] = silu(s.sz[buf][l][c]);
  }
}

// NS: slices held in registers (ceil(d_state / 16) rounded to an instantiated count); slices past nslices skipped.
template <typename T, int NS>
MF_DEVICE void ssm_scan_tokens_ns(T* __restrict__ out, float* __restrict__ state, const T* __restrict__ u,
                                  const T* __restrict__ dt, const float* __restrict__ dt_bias,
                                  const float* __restrict__ A_log, const T* __restrict__ x_dbl,
                                  const float* __restrict__ Dp, const T* __restrict__ xz, int batch, int d_inner,
                                  int d_state, int dt_rank, int x_dbl_stride, long long L, TokScanSmem& sm) {
  const int c = threadIdx.x >> 1, q = threadIdx.x & 1;
  const int d0 = blockIdx.x * kTokChannels;
  const int d = d0 + c;
  const bool dvalid = d < d_inner;
  const int dl = min(d, d_inner - 1);
  const int nslices = (d_state + 15) >> 4;
  const float Dd = Dp[dl], bias = dt_bias[dl];
  // one slice (d_state <= 16, Mamba-1's 16): the staging derives dt', dt' u and silu(z); more slices fill the
  // registers with states, so their loop derives them as the step does (the same expressions either way)
  constexpr bool kDerive = NS == 1;
  static_assert(kTokThreads % kTokChannels == 0, "a staging thread keeps one channel");
  const float stage_bias = dt_bias[min(d0 + (int)threadIdx.x % kTokChannels, d_inner - 1)];
  float a2[NS][2][4];
#pragma unroll
  for (int s = 0; s < NS; ++s)
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = 16 * s + 4 * (q + 2 * k) + j;
        const float al = n < d_state ? A_log[(long long)dl * d_state + n] : 0.f;
        a2[s][k][j] = -scan_exp2(fmaf(al, kLog2e, kLog2Log2e));
      }
  for (long long b = blockIdx.y; b < batch; b += gridDim.y) {
    float* srow = state + ((long long)b * d_inner + dl) * d_state;
    float h[NS][2][4];
#pragma unroll
    for (int s = 0; s < NS; ++s)
#pragma unroll
      for (int k = 0; k < 2; ++k)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int n = 16 * s + 4 * (q + 2 * k) + j;
          h[s][k][j] = (dvalid && n < d_state) ? srow[n] : 0.f;
        }
    TokScanTile<T> nxt;
    tok_scan_load<T>(nxt, u, dt, xz, x_dbl, b, L, 0, d0, d_inner, d_state, dt_rank, x_dbl_stride);
    __syncthreads();  // the previous row's last tile is no longer read
    tok_scan_stage<T, kDerive>(nxt, sm, 0, stage_bias);
    __syncthreads();
    const long long ntiles = (L + kTokSteps - 1) / kTokSteps;
    for (long long tile = 0; tile < ntiles; ++tile) {
      const int buf = (int)(tile & 1);
      const long long l0 = tile * kTokSteps;
      if (tile + 1 < ntiles)
        tok_scan_load<T>(nxt, u, dt, xz, x_dbl, b, L, l0 + kTokSteps, d0, d_inner, d_state, dt_rank, x_dbl_stride);
      const int steps = (int)min((long long)kTokSteps, L - l0);
      // unrolled: a step's inputs (the exponentials, dt' u B) do not wait on the previous step, only the state's
      // fma chain does, so the scheduler overlaps consecutive steps (measured: 1.56 ms at B8 D2048 L2048 rolled,
      // 1.43 ms unrolled by 4 with softplus and silu in the loop; latency-bound with 8 warps per SM)
#pragma unroll 4
      for (int l = 0; l < steps; ++l) {
        const float dtv = kDerive ? sm.dtv[buf][l][c] : softplus(sm.dtv[buf][l][c] + bias);
        const float dtu = kDerive ? sm.dtu[buf][l][c] : dtv * sm.u[buf][l][c];
        const float* bl = sm.bc[buf][l];
        float acc = 0.f;
#pragma unroll
        for (int s = 0; s < NS; ++s) {
          if (s < nslices) {
            float part[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) {
              const int n0 = 16 * s + 4 * (q + 2 * k);
#pragma unroll
              for (int j = 0; j < 4; ++j) h[s][k][j] = fmaf(scan_exp2(dtv * a2[s][k][j]), h[s][k][j], dtu * bl[n0 + j]);
              float pk = bl[MF_STATE_CAP + n0] * h[s][k][0];
#pragma unroll
              for (int j = 1; j < 4; ++j) pk = fmaf(bl[MF_STATE_CAP + n0 + j], h[s][k][j], pk);
              part[k] = pk;
            }
            acc += part[0] + part[1];
          }
        }
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (dvalid && q == 0) {
          float y = fmaf(Dd, sm.u[buf][l][c], acc);
          y *= kDerive ? sm.sz[buf][l][c] : silu(sm.sz[buf][l][c]);
          out[((long long)b * L + l0 + l) * d_inner + d] = from_f32<T>(y);
        }
      }
      if (tile + 1 < ntiles) tok_scan_stage<T, kDerive>(nxt, sm, buf ^ 1, stage_bias);
      __syncthreads();
    }
    if (dvalid) {
#pragma unroll
      for (int s = 0; s < NS; ++s)
#pragma unroll
        for (int k = 0; k < 2; ++k)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int n = 16 * s + 4 * (q + 2 * k) + j;
            if (n < d_state) srow[n] = h[s][k][j];
          }
    }
  }
}

template <typename T>
MF_DEVICE void ssm_scan_tokens(T* __restrict__ out, float* __restrict__ state, const T* __restrict__ u,
                               const T* __restrict__ dt, const float* __restrict__ dt_bias,
                               const float* __restrict__ A_log, const T* __restrict__ x_dbl,
                               const float* __restrict__ Dp, const T* __restrict__ xz, int batch, int d_inner,
                               int d_state, int dt_rank, long long L) {
  __shared__ TokScanSmem sm;
  const int x_dbl_stride = dt_rank + 2 * d_state;
  if (d_state < 1 || d_state > MF_STATE_CAP || d_inner < 1 || dt_rank < 0 || L < 1) return;
  constexpr int NSMAX = MF_STATE_CAP / 16;
  const int nslices = (d_state + 15) >> 4;
#define MF_TOK_SCAN(NS) \
  ssm_scan_tokens_ns<T, NS>(out, state, u, dt, dt_bias, A_log, x_dbl, Dp, xz, batch, d_inner, d_state, dt_rank, \
                            x_dbl_stride, L, sm)
  if (nslices == 1) {
    MF_TOK_SCAN(1);
  } else if (nslices == 2 && NSMAX >= 2) {
    MF_TOK_SCAN(NSMAX >= 2 ? 2 : 1);
  } else if (nslices <= 4 && NSMAX >= 4) {
    MF_TOK_SCAN(NSMAX >= 4 ? 4 : 1);
  } else {
    MF_TOK_SCAN(NSMAX);
  }
#undef MF_TOK_SCAN
}

// ---- the causal conv1d ---------------------------------------------------------------------------------------
// out[b, l, c] = silu(bias[c] + sum_k w[c, k] x[b, l - (width-1) + k, c]) with x = xz[:, :d] (row stride 2 d), in
// conv1d_step_w's arithmetic (window widened to f64, conv_dot, mf::silu); positions before 0 come from
// conv_state [b, c, width-1] (oldest first), the previous chunk's last inputs (zeros for a fresh sequence).
// Thread: one channel, kTokConvSteps consecutive timesteps (consecutive threads: consecutive channels, so each
// timestep's loads and stores are coalesced). In place safe: only the thread of a channel's first tile reads
// conv_state, and that thread alone writes the new state (the last width-1 inputs, read from x) after its reads.
constexpr int kTokConvSteps = 32;
constexpr int kTokConvBlock = 128;

template <typename T, int W>
MF_DEVICE void conv1d_tokens_w(T* __restrict__ out, T* __restrict__ conv_state, const T* __restrict__ xz,
                               const float* __restrict__ weight, const float* __restrict__ bias, long long b, int c,
                               int d, long long L, long long l0) {
  double w[W], win[W];
#pragma unroll
  for (int k = 0; k < W; ++k) w[k] = weight[(long long)c * W + k];
  const double bc = (double)bias[c];
  T* st = conv_state + ((long long)b * d + c) * (W - 1);
  const long long xs = 2LL * d;
  const T* xrow = xz + b * L * xs + c;
  // the window before l0: inputs at l0 - (W-1) .. l0 - 1, from x or (before 0) the state
#pragma unroll
  for (int k = 0; k + 1 < W; ++k) {
    const long long p = l0 - (W - 1) + k;
    win[k + 1] = p >= 0 ? (double)to_f32(xrow[p * xs]) : (double)to_f32(st[p + (W - 1)]);
  }
  auto emit = [&](long long l, T xt) {
#pragma unroll
    for (int k = 0; k + 1 < W; ++k) win[k] = win[k + 1];
    win[W - 1] = (double)to_f32(xt);
    out[(b * L + l) * d + c] = from_f32<T>(silu(conv_dot<W>(w, win, bc)));
  };
  if (l0 + kTokConvSteps <= L) {
    T xv[kTokConvSteps];  // a whole tile: every load in flight before the first output
#pragma unroll
    for (int i = 0; i < kTokConvSteps; ++i) xv[i] = xrow[(l0 + i) * xs];
#pragma unroll
    for (int i = 0; i < kTokConvSteps; ++i) emit(l0 + i, xv[i]);
  } else {
    for (long long l = l0; l < L; ++l) emit(l, xrow[l * xs]);
  }
  if (l0 == 0 && W > 1) {
    // the new state: the last W-1 inputs of [state, x], oldest first (read before any write: the first loop
    // above read the old state into win already, and the state's tail past L comes from it)
    T nw[W > 1 ? W - 1 : 1];
#pragma unroll
    for (int k = 0; k + 1 < W; ++k) {
      const long long p = L - (W - 1) + k;
      nw[k] = p >= 0 ? xrow[p * xs] : st[p + (W - 1)];
    }
#pragma unroll
    for (int k = 0; k + 1 < W; ++k) st[k] = nw[k];
  }
}

template <typename T>
MF_DEVICE void conv1d_tokens(T* __restrict__ out, T* __restrict__ conv_state, const T* __restrict__ xz,
                             const float* __restrict__ weight, const float* __restrict__ bias, int batch, int d,
                             long long L, int width) {
  const int c = blockIdx.x * kTokConvBlock + threadIdx.x;
  if (c >= d || L < 1) return;
  for (long long b = blockIdx.z; b < batch; b += gridDim.z) {
    for (long long l0 = (long long)blockIdx.y * kTokConvSteps; l0 < L; l0 += (long long)gridDim.y * kTokConvSteps) {
      switch (width) {
        case 1: conv1d_tokens_w<T, 1>(out, conv_state, xz, weight, bias, b, c, d, L, l0); break;
        case 2: conv1d_tokens_w<T, 2>(out, conv_state, xz, weight, bias, b, c, d, L, l0); break;
        case 3: conv1d_tokens_w<T, 3>(out, conv_state, xz, weight, bias, b, c, d, L, l0); break;
        case 4: conv1d_tokens_w<T, 4>(out, conv_state, xz, weight, bias, b, c, d, L, l0); break;
        default: return;
      }
    }
  }
}

}  // namespace mf
