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
// Block: kTokChannels channels x 4 lanes (lane j of channel c is thread 4c + j); grid x over channel blocks, y over
// batch rows (strided past 65535). Lane j owns chunk j of every 16-state slice, the states n = 16 s + 4 j + i
// (i < 4), in registers for the whole sequence: four lanes per channel, so a prefill has b * d * 4 threads
// (2,048 warps at B8 D2048, ~16 per SM) where two lanes of eight states left ~8 warps per SM latency-bound
// (1.28 ms at B8 D2048 L2048, ~1,240 cycles per step per warp); 16-channel blocks spread a batch-1 prefill over
// 128 SMs of 132.
//
// Per timestep, exactly the operations of ssm_step_forward_fused (mf/decode.cuh at LANES = 2, lane q owning chunks
// q and q + 2) in its order:
//   dt' = softplus(dt + dt_bias), dtu = dt' u; per state: h = fma(2^(dt' a2), h, dtu B), a2 = -2^(A_log log2e +
//   log2(log2e)); per chunk P = C0 h0, then P = fma(Cj, hj, P); per slice acc += P_q + P_(q+2) (slices in order,
//   acc from 0); y = acc_0 + acc_1; out = fma(D, u, y) silu(z).
// Here lane j holds P_j: a shuffle across lanes j and j ^ 2 gives lane q the step's P_q + P_(q+2) (lane q + 2 gets
// P_(q+2) + P_q, the same bits: a + b == b + a), and one across j ^ 1 the final acc_0 + acc_1 on every lane.
// Inputs come in tiles of kTokSteps timesteps: each thread loads one quad of four channels of u, dt, z at one
// timestep and NS quads of the step's B, C span (vector loads when every row is aligned), derives dt', dt' u and
// silu(z) from its registers with the step's expressions, and stores them to shared memory (f32, double buffered,
// one barrier per tile); the next tile's loads are in flight while this one's steps run.
// States past d_state (in the last slice) hold 0 and meet B = C = 0, as the step's scalar path loads them.
constexpr int kTokChannels = 16;
constexpr int kTokLanes = 4;
constexpr int kTokThreads = kTokLanes * kTokChannels;
constexpr int kTokSteps = 16;
constexpr int kTokMinBlocks = 8;  // 8 blocks of 2 warps per SM (128 registers a thread): tokens.toml bounds
constexpr int kTokQuadsPerRow = kTokChannels / 4;                          // quads of u (dt, z) per timestep
constexpr int kTokBCQuads = kTokSteps * 8 / kTokThreads;                   // B, C quads per thread per slice
static_assert(kTokSteps * kTokQuadsPerRow == kTokThreads, "one u/dt/z quad per thread per tile");
static_assert(kTokSteps * 8 % kTokThreads == 0 && kTokSteps % 4 == 0, "whole B, C quads per thread; 4-step groups");

struct TokScanSmem {
  float2 dd[2][kTokSteps][kTokChannels];  // (dt' = softplus(dt + dt_bias), dt' u): one load per step
  float2 us[2][kTokSteps][kTokChannels];  // (u, silu(z)): the output's operands
  // [l][16 s + 4 j + i] = B_n, [l][16 NS + n] = C_n: 0 past d_state
  float bc[2][kTokSteps][2 * MF_STATE_CAP];
};
static_assert(sizeof(TokScanSmem) <= 48 * 1024, "TokScanSmem: static shared memory is capped at 48 KiB");

// One thread's share of a tile, raw: u, dt, z at timestep l0 + tid / kTokQuadsPerRow, channels
// d0 + 4 (tid % kTokQuadsPerRow) .. + 4; B, C quads e = tid + k kTokThreads (k < kTokBCQuads NS) of the span of
// timestep l0 + e / (8 NS): e % (8 NS) < 4 NS is the B quad at n = 4 (e % (8 NS)), else the C quad.
template <typename T, int NS> struct TokScanTile {
  float u[4], dt[4], z[4], bc[NS > 0 ? kTokBCQuads * NS : 1][4];  // NS 0: no B, C
};

template <typename T>
MF_DEVICE void tok_load4(const T* __restrict__ p, bool vec, int nv, float (&o)[4]) {
  if (vec && nv == 4) {
    load_quad(p, true, 4, o);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = i < nv ? to_f32(p[i]) : 0.f;
  }
}

// B, C quad e of a tile (NS slices): its timestep l and slot q in the staged row (B quads fill [0, 4 NS), C quads
// [4 NS, 8 NS), so the step loop's offsets do not depend on d_state), where it starts in x_dbl, and how many of
// its four elements are in range (`nv`: 0 past the sequence or past d_state).
template <typename T, int NS> struct TokBCQuad {
  int l, q, nv;
  const T* src;
};

template <typename T, int NS>
MF_DEVICE TokBCQuad<T, NS> tok_bc_quad(const T* __restrict__ x_dbl, int e, long long b, long long L, long long l0,
                                       int d_state, int dt_rank, int x_dbl_stride) {
  static_assert(NS > 0, "at least one slice");
  TokBCQuad<T, NS> o;
  o.l = e / (8 * NS);
  o.q = e % (8 * NS);
  const bool isb = o.q < 4 * NS;
  const int n0 = 4 * (isb ? o.q : o.q - 4 * NS);
  const bool lok = l0 + o.l < L;
  o.nv = lok ? min(max(d_state - n0, 0), 4) : 0;
  const long long row = b * L + (lok ? l0 + o.l : 0);
  o.src = x_dbl + row * x_dbl_stride + dt_rank + (isb ? 0 : d_state) + n0;
  return o;
}

template <typename T, int NS>
MF_DEVICE void tok_scan_load(TokScanTile<T, NS>& r, const T* __restrict__ u, const T* __restrict__ dt,
                             const T* __restrict__ xz, const T* __restrict__ x_dbl, long long b, long long L,
                             long long l0, int d0, int d_inner, int d_state, int dt_rank, int x_dbl_stride, bool vec) {
  const int t = threadIdx.x;
  {
    const int l = t / kTokQuadsPerRow, cg = d0 + 4 * (t % kTokQuadsPerRow);
    const bool lok = l0 + l < L;
    const int nv = lok ? min(max(d_inner - cg, 0), 4) : 0;
    const long long row = b * L + (lok ? l0 + l : 0);
    tok_load4(u + row * d_inner + cg, vec, nv, r.u);
    tok_load4(dt + row * d_inner + cg, vec, nv, r.dt);
    tok_load4(xz + row * 2 * d_inner + d_inner + cg, vec, nv, r.z);
  }
  if constexpr (NS > 0) {
#pragma unroll
    for (int k = 0; k < kTokBCQuads * NS; ++k) {
      const auto bq = tok_bc_quad<T, NS>(x_dbl, t + k * kTokThreads, b, L, l0, d_state, dt_rank, x_dbl_stride);
      tok_load4(bq.src, vec, bq.nv, r.bc[k]);
    }
  }
}

// The tile's derived values into buffer `buf`: dt' = softplus(dt + bias), dt' u, silu(z), with the step's
// expressions (mf/decode.cuh, FUSED), so the bits are the step's; B, C as f32. bias: dt_bias of this thread's four
// staging channels.
template <typename T, int NS>
MF_DEVICE void tok_scan_stage(const TokScanTile<T, NS>& r, TokScanSmem& s, int buf, const float (&bias)[4]) {
  const int t = threadIdx.x;
  const int l = t / kTokQuadsPerRow, c0 = 4 * (t % kTokQuadsPerRow);
  float dd[8], us[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    dd[2 * i] = softplus(r.dt[i] + bias[i]);
    dd[2 * i + 1] = dd[2 * i] * r.u[i];
    us[2 * i] = r.u[i];
    us[2 * i + 1] = silu(r.z[i]);
  }
  float4* ddp = reinterpret_cast<float4*>(&s.dd[buf][l][c0]);
  float4* usp = reinterpret_cast<float4*>(&s.us[buf][l][c0]);
  ddp[0] = make_float4(dd[0], dd[1], dd[2], dd[3]);
  ddp[1] = make_float4(dd[4], dd[5], dd[6], dd[7]);
  usp[0] = make_float4(us[0], us[1], us[2], us[3]);
  usp[1] = make_float4(us[4], us[5], us[6], us[7]);
  if constexpr (NS > 0) {
#pragma unroll
    for (int k = 0; k < kTokBCQuads * NS; ++k) {
      const int e = t + k * kTokThreads, ls = e / (8 * NS), q = e % (8 * NS);  // as tok_bc_quad
      *reinterpret_cast<float4*>(&s.bc[buf][ls][4 * q]) = make_float4(r.bc[k][0], r.bc[k][1], r.bc[k][2], r.bc[k][3]);
    }
  }
}

// Load and stage at once (no prefetch): the first tile, and every tile when the states fill the registers; B, C
// one quad at a time, loaded and stored, so at most one quad of them is live.
template <typename T, int NS>
MF_DEVICE void tok_scan_fill(TokScanSmem& s, int buf, const float (&bias)[4], const T* __restrict__ u,
                             const T* __restrict__ dt, const T* __restrict__ xz, const T* __restrict__ x_dbl,
                             long long b, long long L, long long l0, int d0, int d_inner, int d_state, int dt_rank,
                             int x_dbl_stride, bool vec) {
  TokScanTile<T, 0> r;
  tok_scan_load<T, 0>(r, u, dt, xz, x_dbl, b, L, l0, d0, d_inner, d_state, dt_rank, x_dbl_stride, vec);
  tok_scan_stage<T, 0>(r, s, buf, bias);
  const int t = threadIdx.x;
#pragma unroll 2
  for (int k = 0; k < kTokBCQuads * NS; ++k) {
    const auto bq = tok_bc_quad<T, NS>(x_dbl, t + k * kTokThreads, b, L, l0, d_state, dt_rank, x_dbl_stride);
    float v[4];
    tok_load4(bq.src, vec, bq.nv, v);
    *reinterpret_cast<float4*>(&s.bc[buf][bq.l][4 * bq.q]) = make_float4(v[0], v[1], v[2], v[3]);
  }
}

// One timestep of lane j's states (slices past nslices skipped): the step's arithmetic; returns the channel's
// sum over every state, acc_0 + acc_1 of the step, the same bits on all four lanes.
template <int NS>
MF_DEVICE float tok_scan_step(float (&h)[NS][4], const float (&a2)[NS][4], float2 dd, const float* __restrict__ bl,
                              int j, int nslices) {
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    if (s < nslices) {
      const float4 bq = *reinterpret_cast<const float4*>(bl + 16 * s + 4 * j);
      const float4 cq = *reinterpret_cast<const float4*>(bl + 16 * NS + 16 * s + 4 * j);
      h[s][0] = fmaf(scan_exp2(dd.x * a2[s][0]), h[s][0], dd.y * bq.x);
      h[s][1] = fmaf(scan_exp2(dd.x * a2[s][1]), h[s][1], dd.y * bq.y);
      h[s][2] = fmaf(scan_exp2(dd.x * a2[s][2]), h[s][2], dd.y * bq.z);
      h[s][3] = fmaf(scan_exp2(dd.x * a2[s][3]), h[s][3], dd.y * bq.w);
      float p = cq.x * h[s][0];
      p = fmaf(cq.y, h[s][1], p);
      p = fmaf(cq.z, h[s][2], p);
      p = fmaf(cq.w, h[s][3], p);
      acc += p + __shfl_xor_sync(0xffffffffu, p, 2);
    }
  }
  return acc + __shfl_xor_sync(0xffffffffu, acc, 1);
}

// NS: slices held in registers (ceil(d_state / 16) rounded to an instantiated count); slices past nslices skipped.
template <typename T, int NS>
MF_DEVICE void ssm_scan_tokens_ns(T* __restrict__ out, float* __restrict__ state, const T* __restrict__ u,
                                  const T* __restrict__ dt, const float* __restrict__ dt_bias,
                                  const float* __restrict__ A_log, const T* __restrict__ x_dbl,
                                  const float* __restrict__ Dp, const T* __restrict__ xz, int batch, int d_inner,
                                  int d_state, int dt_rank, int x_dbl_stride, long long L, TokScanSmem& sm) {
  const int c = threadIdx.x / kTokLanes, j = threadIdx.x % kTokLanes;
  const int d0 = blockIdx.x * kTokChannels;
  const int d = d0 + c;
  const bool dvalid = d < d_inner;
  const int dl = min(d, d_inner - 1);
  const int nslices = (d_state + 15) >> 4;
  const float Dd = Dp[dl];
  constexpr bool kPrefetch = NS == 1;
  // whole quads everywhere (every row's quads aligned): one vector load per quad; else guarded scalar loads
  const bool vec = (d_inner & 3) == 0 && (d_state & 3) == 0 && (dt_rank & 3) == 0 && (x_dbl_stride & 3) == 0 &&
                   aligned_quad(u) && aligned_quad(dt) && aligned_quad(xz) && aligned_quad(x_dbl);
  float stage_bias[4];
  {
    const int cg = d0 + 4 * ((int)threadIdx.x % kTokQuadsPerRow);
#pragma unroll
    for (int i = 0; i < 4; ++i) stage_bias[i] = dt_bias[min(cg + i, d_inner - 1)];
  }
  float a2[NS][4];
#pragma unroll
  for (int s = 0; s < NS; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = 16 * s + 4 * j + i;
      const float al = n < d_state ? A_log[(long long)dl * d_state + n] : 0.f;
      a2[s][i] = -scan_exp2(fmaf(al, kLog2e, kLog2Log2e));
    }
  for (long long b = blockIdx.y; b < batch; b += gridDim.y) {
    float* srow = state + ((long long)b * d_inner + dl) * d_state;
    float h[NS][4];
#pragma unroll
    for (int s = 0; s < NS; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int n = 16 * s + 4 * j + i;
        h[s][i] = (dvalid && n < d_state) ? srow[n] : 0.f;
      }
    TokScanTile<T, kPrefetch ? NS : 0> nxt;
    __syncthreads();  // the previous row's last tile is no longer read
    tok_scan_fill<T, NS>(sm, 0, stage_bias, u, dt, xz, x_dbl, b, L, 0, d0, d_inner, d_state, dt_rank, x_dbl_stride, vec);
    __syncthreads();
    const long long ntiles = (L + kTokSteps - 1) / kTokSteps;
    T* orow = out + (long long)b * L * d_inner + d;
    // y of step l (acc: the step's sum) into out: fma(D, u, acc) silu(z), as the step
    auto emit = [&](int buf, long long l0, int l, float acc) {
      const float2 v = sm.us[buf][l][c];
      float y = fmaf(Dd, v.x, acc);
      y *= v.y;
      orow[(l0 + l) * d_inner] = from_f32<T>(y);
    };
    for (long long tile = 0; tile < ntiles; ++tile) {
      const int buf = (int)(tile & 1);
      const long long l0 = tile * kTokSteps;
      // one slice: the next tile's loads fly during this tile's steps; more slices load after the steps (the
      // prefetched registers beside 8-16 states each of h and a2 would spill under the 128-register bound)
      if (kPrefetch && tile + 1 < ntiles)
        tok_scan_load<T, kPrefetch ? NS : 0>(nxt, u, dt, xz, x_dbl, b, L, l0 + kTokSteps, d0, d_inner, d_state, dt_rank,
                             x_dbl_stride, vec);
      const int steps = (int)min((long long)kTokSteps, L - l0);
      if (NS == 1 && steps == kTokSteps) {
        // a whole tile of one slice (Mamba's 16 states) in two passes: the states' recurrence over the 16 steps,
        // keeping each step's chunk sum P, then the cross-lane sums and outputs of all 16 steps. The recurrence
        // then holds only fma chains (a step's exponentials and dt' u B do not wait on the previous step), and the
        // 32 shuffles are independent of each other, so neither pass waits on a shuffle per step. The operations
        // and their order per step are the step's (tok_scan_step). Every lane ends a step with the same sum, so
        // lane j writes steps j, j + 4, ...: one output sequence per four steps.
        float pk[kTokSteps];
#pragma unroll
        for (int l = 0; l < kTokSteps; ++l) {
          const float2 dd = sm.dd[buf][l][c];
          const float4 bq = *reinterpret_cast<const float4*>(&sm.bc[buf][l][4 * j]);
          const float4 cq = *reinterpret_cast<const float4*>(&sm.bc[buf][l][16 * NS + 4 * j]);
          h[0][0] = fmaf(scan_exp2(dd.x * a2[0][0]), h[0][0], dd.y * bq.x);
          h[0][1] = fmaf(scan_exp2(dd.x * a2[0][1]), h[0][1], dd.y * bq.y);
          h[0][2] = fmaf(scan_exp2(dd.x * a2[0][2]), h[0][2], dd.y * bq.z);
          h[0][3] = fmaf(scan_exp2(dd.x * a2[0][3]), h[0][3], dd.y * bq.w);
          float p = cq.x * h[0][0];
          p = fmaf(cq.y, h[0][1], p);
          p = fmaf(cq.z, h[0][2], p);
          pk[l] = fmaf(cq.w, h[0][3], p);
        }
#pragma unroll
        for (int l = 0; l < kTokSteps; ++l) {
          float acc = 0.f;
          acc += pk[l] + __shfl_xor_sync(0xffffffffu, pk[l], 2);
          pk[l] = acc + __shfl_xor_sync(0xffffffffu, acc, 1);
        }
        if (dvalid) {
#pragma unroll
          for (int g = 0; g < kTokSteps; g += 4) {
            const float mine = j == 0 ? pk[g] : j == 1 ? pk[g + 1] : j == 2 ? pk[g + 2] : pk[g + 3];
            emit(buf, l0, g + j, mine);
          }
        }
      } else {
#pragma unroll 1
        for (int l = 0; l < steps; ++l) {
          const float acc = tok_scan_step<NS>(h, a2, sm.dd[buf][l][c], sm.bc[buf][l], j, nslices);
          if (dvalid && j == 0) emit(buf, l0, l, acc);
        }
      }
      // buffer buf ^ 1 was last read by the previous tile's steps, which every thread finished before the barrier
      if (tile + 1 < ntiles) {
        if (kPrefetch)
          tok_scan_stage<T, kPrefetch ? NS : 0>(nxt, sm, buf ^ 1, stage_bias);
        else
          tok_scan_fill<T, NS>(sm, buf ^ 1, stage_bias, u, dt, xz, x_dbl, b, L, l0 + kTokSteps, d0, d_inner, d_state,
                               dt_rank, x_dbl_stride, vec);
      }
      __syncthreads();
    }
    if (dvalid) {
#pragma unroll
      for (int s = 0; s < NS; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int n = 16 * s + 4 * j + i;
          if (n < d_state) srow[n] = h[s][i];
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
  __shared__ __align__(16) TokScanSmem sm;
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
