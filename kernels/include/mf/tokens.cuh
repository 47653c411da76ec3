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

// B and C are staged, and the state held in registers, for at most kTokStateCap states: a build with a larger
// state capacity (--state-cap 256) overflowed the 48 KiB of static shared memory and failed the whole module,
// and at 128 the saving scan spills; these families refuse d_state above 64 (tokens.toml requires) and the
// parallel scan families serve the build's whole capacity. At the default capacity (64) the code is unchanged.
constexpr int kTokStateCap = MF_STATE_CAP < 64 ? MF_STATE_CAP : 64;

struct TokScanSmem {
  float2 dd[2][kTokSteps][kTokChannels];  // (dt' = softplus(dt + dt_bias), dt' u): one load per step
  float2 us[2][kTokSteps][kTokChannels];  // (u, silu(z)): the output's operands
  // [l][16 s + 4 j + i] = B_n, [l][16 NS + n] = C_n: 0 past d_state
  float bc[2][kTokSteps][2 * kTokStateCap];
};
static_assert(sizeof(TokScanSmem) <= 48 * 1024, "TokScanSmem: static shared memory is capped at 48 KiB");

// One thread's share of a tile, raw: u, dt, z at timestep l0 + tid / kTokQuadsPerRow, channels
// d0 + 4 (tid % kTokQuadsPerRow) .. + 4; B, C quads e = tid + k kTokThreads (k < kTokBCQuads NS) of the span of
// timestep l0 + e / (8 NS): e % (8 NS) < 4 NS is the B quad at n = 4 (e % (8 NS)), else the C quad.
// Raw: converted to f32 only when staged, so a tile's loads are still in flight while the steps run (converted as
// they landed, each wait came right after its load: 56% of the stall samples at B1 D2048, Nsight Compute). 16-bit
// types stay packed two to a word on both load paths, so the paths meet without unpacking.
template <int S> struct TokRawWord { using type = float; };
template <> struct TokRawWord<2> { using type = unsigned; };
template <typename T> struct TokRaw {
  typename TokRawWord<sizeof(T)>::type w[sizeof(T) == 2 ? 2 : 4];
};

template <typename T, int NS> struct TokScanTile {
  TokRaw<T> u, dt, z, bc[NS > 0 ? kTokBCQuads * NS : 1];  // NS 0: no B, C
};

// p[0 .. 4) raw: one vector load when `vec` (aligned) and all four are in range, else scalar loads (zero past nv).
template <typename T>
MF_DEVICE TokRaw<T> tok_load_raw(const T* __restrict__ p, bool vec, int nv) {
  TokRaw<T> q;
  if constexpr (sizeof(T) == 2) {
    if (vec && nv == 4) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      q.w[0] = v.x, q.w[1] = v.y;
    } else {
      const unsigned short* bits = reinterpret_cast<const unsigned short*>(p);
      unsigned e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) e[i] = i < nv ? (unsigned)bits[i] : 0u;  // 0u: +0.0
      q.w[0] = e[0] | (e[1] << 16), q.w[1] = e[2] | (e[3] << 16);
    }
  } else {
    if (vec && nv == 4) {
      const float4 v = *reinterpret_cast<const float4*>(p);
      q.w[0] = v.x, q.w[1] = v.y, q.w[2] = v.z, q.w[3] = v.w;
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) q.w[i] = i < nv ? to_f32(p[i]) : 0.f;
    }
  }
  return q;
}

// Element i of a raw quad as f32 (to_f32 of the same T value: the bits the direct conversion gives).
template <typename T>
MF_DEVICE float tok_raw_f32(const TokRaw<T>& q, int i) {
  if constexpr (sizeof(T) == 2) {
    const unsigned short bits = (unsigned short)(q.w[i / 2] >> (16 * (i % 2)));
    return to_f32(*reinterpret_cast<const T*>(&bits));
  } else {
    return q.w[i];
  }
}

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
                             long long l0, int d0, int d_inner, int d_state, int dt_rank, int x_dbl_stride, bool vec,
                             int t) {
  {
    const int l = t / kTokQuadsPerRow, cg = d0 + 4 * (t % kTokQuadsPerRow);
    const bool lok = l0 + l < L;
    const int nv = lok ? min(max(d_inner - cg, 0), 4) : 0;
    const long long row = b * L + (lok ? l0 + l : 0);
    r.u = tok_load_raw(u + row * d_inner + cg, vec, nv);
    r.dt = tok_load_raw(dt + row * d_inner + cg, vec, nv);
    r.z = tok_load_raw(xz + row * 2 * d_inner + d_inner + cg, vec, nv);
  }
  if constexpr (NS > 0) {
#pragma unroll
    for (int k = 0; k < kTokBCQuads * NS; ++k) {
      const auto bq = tok_bc_quad<T, NS>(x_dbl, t + k * kTokThreads, b, L, l0, d_state, dt_rank, x_dbl_stride);
      r.bc[k] = tok_load_raw(bq.src, vec, bq.nv);
    }
  }
}

// The tile's derived values into buffer `buf`: dt' = softplus(dt + bias), dt' u, silu(z), with the step's
// expressions (mf/decode.cuh, FUSED), so the bits are the step's; B, C as f32. bias: dt_bias of this thread's four
// staging channels.
template <typename T, int NS, typename Smem>
MF_DEVICE void tok_scan_stage(const TokScanTile<T, NS>& r, Smem& s, int buf, const float (&bias)[4], int t) {
  const int l = t / kTokQuadsPerRow, c0 = 4 * (t % kTokQuadsPerRow);
  float dd[8], us[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float ui = tok_raw_f32(r.u, i);
    dd[2 * i] = softplus(tok_raw_f32(r.dt, i) + bias[i]);
    dd[2 * i + 1] = dd[2 * i] * ui;
    us[2 * i] = ui;
    us[2 * i + 1] = silu(tok_raw_f32(r.z, i));
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
      *reinterpret_cast<float4*>(&s.bc[buf][ls][4 * q]) =
          make_float4(tok_raw_f32(r.bc[k], 0), tok_raw_f32(r.bc[k], 1), tok_raw_f32(r.bc[k], 2), tok_raw_f32(r.bc[k], 3));
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
  const int t = threadIdx.x;
  tok_scan_load<T, 0>(r, u, dt, xz, x_dbl, b, L, l0, d0, d_inner, d_state, dt_rank, x_dbl_stride, vec, t);
  tok_scan_stage<T, 0>(r, s, buf, bias, t);
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

// A whole tile of one slice (Mamba's 16 states) in two passes: the states' recurrence over the kTokSteps steps,
// keeping each step's chunk sum P, then the cross-lane sums and outputs of all the steps. The recurrence then holds
// only fma chains (a step's exponentials and dt' u B do not wait on the previous step), and the 32 shuffles are
// independent of each other, so neither pass waits on a shuffle per step. The operations and their order per step
// are the step's (tok_scan_step). Every lane ends a step with the same sum, so lane j emits steps j, j + 4, ...: one
// output sequence per four steps. dd: the tile's staged (dt', dt' u) [step][channel]; bc: its B, C rows (row
// stride bc_row floats, B at 4 j, C at 16 + 4 j); emit(step, sum).
template <typename Emit>
MF_DEVICE void tok_scan_tile1(float (&h)[4], const float (&a2)[4], const float2 (*__restrict__ dd)[kTokChannels],
                              const float* __restrict__ bc, int bc_row, int c, int j, bool dvalid, Emit emit) {
  float pk[kTokSteps];
#pragma unroll
  for (int l = 0; l < kTokSteps; ++l) {
    const float2 dl = dd[l][c];
    const float4 bq = *reinterpret_cast<const float4*>(bc + l * bc_row + 4 * j);
    const float4 cq = *reinterpret_cast<const float4*>(bc + l * bc_row + 16 + 4 * j);
    h[0] = fmaf(scan_exp2(dl.x * a2[0]), h[0], dl.y * bq.x);
    h[1] = fmaf(scan_exp2(dl.x * a2[1]), h[1], dl.y * bq.y);
    h[2] = fmaf(scan_exp2(dl.x * a2[2]), h[2], dl.y * bq.z);
    h[3] = fmaf(scan_exp2(dl.x * a2[3]), h[3], dl.y * bq.w);
    float p = cq.x * h[0];
    p = fmaf(cq.y, h[1], p);
    p = fmaf(cq.z, h[2], p);
    pk[l] = fmaf(cq.w, h[3], p);
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
      emit(g + j, mine);
    }
  }
}

// NS: slices held in registers (ceil(d_state / 16) rounded to an instantiated count); slices past nslices skipped.
// SAVE: also the state before every kScanSaveChunk-th timestep into saved[b, d, c, n] (the training forward's saves,
// the layout ssm_burnin_forward writes and the backward replays from); nothing else changes, so the same bits.
template <typename T, int NS, bool SAVE = false>
MF_DEVICE void ssm_scan_tokens_ns(T* __restrict__ out, float* __restrict__ state, const T* __restrict__ u,
                                  const T* __restrict__ dt, const float* __restrict__ dt_bias,
                                  const float* __restrict__ A_log, const T* __restrict__ x_dbl,
                                  const float* __restrict__ Dp, const T* __restrict__ xz, int batch, int d_inner,
                                  int d_state, int dt_rank, int x_dbl_stride, long long L, TokScanSmem& sm,
                                  float* __restrict__ saved = nullptr) {
  static_assert(kScanSaveChunk % kTokSteps == 0, "saves fall on tile boundaries");
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
    const long long nsaved = (L + kScanSaveChunk - 1) / kScanSaveChunk;
    float* vrow = SAVE ? saved + ((long long)b * d_inner + dl) * nsaved * d_state : nullptr;
    auto store_states = [&](float* dst) {  // this lane's states into dst[n], n < d_state: the saves, the final state
      if (dvalid) {
#pragma unroll
        for (int s = 0; s < NS; ++s)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int n = 16 * s + 4 * j + i;
            if (n < d_state) dst[n] = h[s][i];
          }
      }
    };
    // the state before timestep kScanSaveChunk * chunk
    auto save = [&](long long chunk) { store_states(vrow + chunk * d_state); };
    if constexpr (SAVE) save(0);
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
                             x_dbl_stride, vec, threadIdx.x);
      const int steps = (int)min((long long)kTokSteps, L - l0);
      if (NS == 1 && steps == kTokSteps) {
        tok_scan_tile1(h[0], a2[0], sm.dd[buf], &sm.bc[buf][0][0], 2 * kTokStateCap, c, j, dvalid,
                       [&](int l, float acc) { emit(buf, l0, l, acc); });
      } else {
#pragma unroll 1
        for (int l = 0; l < steps; ++l) {
          const float acc = tok_scan_step<NS>(h, a2, sm.dd[buf][l][c], sm.bc[buf][l], j, nslices);
          if (dvalid && j == 0) emit(buf, l0, l, acc);
        }
      }
      if constexpr (SAVE) {
        if (tile + 1 < ntiles && (l0 + kTokSteps) % kScanSaveChunk == 0) save((l0 + kTokSteps) / kScanSaveChunk);
      }
      // buffer buf ^ 1 was last read by the previous tile's steps, which every thread finished before the barrier
      if (tile + 1 < ntiles) {
        if (kPrefetch)
          tok_scan_stage<T, kPrefetch ? NS : 0>(nxt, sm, buf ^ 1, stage_bias, threadIdx.x);
        else
          tok_scan_fill<T, NS>(sm, buf ^ 1, stage_bias, u, dt, xz, x_dbl, b, L, l0 + kTokSteps, d0, d_inner, d_state,
                               dt_rank, x_dbl_stride, vec);
      }
      __syncthreads();
    }
    store_states(srow);
  }
}

template <typename T, bool SAVE = false>
MF_DEVICE void ssm_scan_tokens_any(T* __restrict__ out, float* __restrict__ state, const T* __restrict__ u,
                                   const T* __restrict__ dt, const float* __restrict__ dt_bias,
                                   const float* __restrict__ A_log, const T* __restrict__ x_dbl,
                                   const float* __restrict__ Dp, const T* __restrict__ xz, int batch, int d_inner,
                                   int d_state, int dt_rank, long long L, float* __restrict__ saved) {
  __shared__ __align__(16) TokScanSmem sm;
  const int x_dbl_stride = dt_rank + 2 * d_state;
  if (d_state < 1 || d_state > kTokStateCap || d_inner < 1 || dt_rank < 0 || L < 1) return;
  constexpr int NSMAX = kTokStateCap / 16;
  const int nslices = (d_state + 15) >> 4;
#define MF_TOK_SCAN(NS) \
  ssm_scan_tokens_ns<T, NS, SAVE>(out, state, u, dt, dt_bias, A_log, x_dbl, Dp, xz, batch, d_inner, d_state, \
                                  dt_rank, x_dbl_stride, L, sm, saved)
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

template <typename T>
MF_DEVICE void ssm_scan_tokens(T* __restrict__ out, float* __restrict__ state, const T* __restrict__ u,
                               const T* __restrict__ dt, const float* __restrict__ dt_bias,
                               const float* __restrict__ A_log, const T* __restrict__ x_dbl,
                               const float* __restrict__ Dp, const T* __restrict__ xz, int batch, int d_inner,
                               int d_state, int dt_rank, long long L) {
  ssm_scan_tokens_any<T>(out, state, u, dt, dt_bias, A_log, x_dbl, Dp, xz, batch, d_inner, d_state, dt_rank, L,
                         nullptr);
}

// ssm_scan_tokens writing the saved states too (the training forward: runtime/torch_train.py scan_saving)
template <typename T>
MF_DEVICE void ssm_scan_tokens_save(T* __restrict__ out, float* __restrict__ state, float* __restrict__ saved,
                                    const T* __restrict__ u, const T* __restrict__ dt,
                                    const float* __restrict__ dt_bias, const float* __restrict__ A_log,
                                    const T* __restrict__ x_dbl, const float* __restrict__ Dp,
                                    const T* __restrict__ xz, int batch, int d_inner, int d_state, int dt_rank,
                                    long long L) {
  ssm_scan_tokens_any<T, true>(out, state, u, dt, dt_bias, A_log, x_dbl, Dp, xz, batch, d_inner, d_state, dt_rank,
                               L, saved);
}

// ---- the selective scan, warp-specialised (d_state <= 16) -------------------------------------------------------
// Why: at a small batch x d_inner (B1 D2048: 128 blocks, one per SM, two warps each) the scan above is latency-bound
// per tile: each warp steps its 16 timesteps, stages the next tile (the accurate softplus and silu, branchy, one
// channel after another) and waits at the barrier, alone on its scheduler. Here the scan warps (threads 0..127:
// 16 channels x 8 lanes) only step and emit, while PW producer warps (threads 128.., in groups of 64 taking items in
// turn) load, stage into a ring of kTokWsStages tiles and hand each over by named barriers (full: producers arrive,
// scan warps wait; empty: the reverse), up to the ring's depth ahead. Measured on the H200 (bf16, L 2048): 119 us
// at B1 D2048 against the four-lane scan's 195 (309 before its loads stayed raw); from two waves on (B2 D2048 224
// against 203, B8 D2048 834 against 395) the four-lane scan's warps win, so the op picks by grid size
// (runtime/torch_ops.py scan_tokens_ws_serves). Timing-only variants at B1 D2048 bound it: the scan warps alone
// 116 us, the producers alone 80 us.
// Staging is per element with the same expressions, and the eight lanes keep four lanes' operations and order
// (tok_chain8), so the outputs and final state equal ssm_scan_tokens' and the decode step's, bit for bit.
// The ring: S tiles (a multiple of the producer groups, so each group always fills the same stages).
template <int S> struct TokWsSmem {
  float2 dd[S][kTokSteps][kTokChannels];
  float2 us[S][kTokSteps][kTokChannels];
  float bc[S][kTokSteps][32];  // [l][4 q] = B_n (q < 4), C_n (q >= 4): 0 past d_state
};
static_assert(sizeof(TokWsSmem<6>) <= 48 * 1024, "TokWsSmem: static shared memory is capped at 48 KiB");

// Named barriers (ids 1..15; __syncthreads is 0): sync waits until n threads arrived, arrive counts and goes on.
#ifdef __CUDA_ARCH__
MF_DEVICE void tok_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
MF_DEVICE void tok_bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
#else
MF_DEVICE void tok_bar_sync(int id, int n) { mf_named_bar(id, n, true); }  // the host emulation's (tests)
MF_DEVICE void tok_bar_arrive(int id, int n) { mf_named_bar(id, n, false); }
#endif

// Eight scan lanes a channel: lane r = 2 j + e holds states 4 j + 2 e + i (i < 2) of chunk j; chunk j's
// C-weighted fma chain (C0 h0, then fma(Ck, hk, .)) starts on lane 2 j and is handed by one shuffle to lane 2 j + 1,
// which finishes it, so P_j ends on the odd lanes; the sums across chunks then pair lanes r ^ 4 and r ^ 2: the same
// operations in the same order as four lanes, on twice the warps.
MF_DEVICE float tok_chain8(const float (&h)[2], float2 cq, int e) {
  const float head = fmaf(cq.y, h[1], cq.x * h[0]);               // lane 2 j: C0 h0, then fma(C1, h1, .)
  const float from = __shfl_xor_sync(0xffffffffu, head, 1);       // lane 2 j + 1 receives lane 2 j's head
  const float tail = fmaf(cq.y, h[1], fmaf(cq.x, h[0], from));    // lane 2 j + 1: fma(C2, h2, .), fma(C3, h3, .)
  return e ? tail : head;
}
MF_DEVICE float tok_sums8(float p) {  // P_q + P_(q+2) (from 0), then acc_0 + acc_1: valid on odd lanes
  float acc = 0.f;
  acc += p + __shfl_xor_sync(0xffffffffu, p, 4);
  return acc + __shfl_xor_sync(0xffffffffu, acc, 2);
}

template <typename T, int PW>
MF_DEVICE void ssm_scan_tokens_ws(T* __restrict__ out, float* __restrict__ state, const T* __restrict__ u,
                                  const T* __restrict__ dt, const float* __restrict__ dt_bias,
                                  const float* __restrict__ A_log, const T* __restrict__ x_dbl,
                                  const float* __restrict__ Dp, const T* __restrict__ xz, int batch, int d_inner,
                                  int d_state, int dt_rank, long long L) {
  static_assert(PW % 2 == 0 && PW >= 2 && PW <= 8, "groups of two warps, one to four groups");
  constexpr int kGroups = PW / 2;
  constexpr int kTokWsStages = kGroups == 3 ? 6 : 4;  // 2 S + 1 named barriers of 16
  constexpr int kScan = kTokChannels * 8;  // the scan warps' threads: eight lanes a channel
  constexpr int kPair = kScan + kTokThreads;  // one barrier's threads: the scan warps and one producer group
  __shared__ __align__(16) TokWsSmem<kTokWsStages> sm;
  if (d_state < 1 || d_state > 16 || d_inner < 1 || dt_rank < 0 || L < 1) return;
  const int x_dbl_stride = dt_rank + 2 * d_state;
  const int d0 = blockIdx.x * kTokChannels;
  const long long ntiles = (L + kTokSteps - 1) / kTokSteps;
  const long long nrows = batch > (int)blockIdx.y ? (batch - 1 - (long long)blockIdx.y) / gridDim.y + 1 : 0;
  const long long items = nrows * ntiles;  // (row, tile) in order: row blockIdx.y + r gridDim.y, tile
  auto full = [](long long k) { return 1 + (int)(k % kTokWsStages); };
  auto empty = [](long long k) { return 1 + kTokWsStages + (int)(k % kTokWsStages); };
  if (threadIdx.x >= kScan) {
    // producer group g: items g, g + kGroups, ...; the next one's loads fly while this one is staged
    const int t = (int)threadIdx.x - kScan, g = t / kTokThreads, pt = t % kTokThreads;
    const bool vec = (d_inner & 3) == 0 && (d_state & 3) == 0 && (dt_rank & 3) == 0 && (x_dbl_stride & 3) == 0 &&
                     aligned_quad(u) && aligned_quad(dt) && aligned_quad(xz) && aligned_quad(x_dbl);
    float bias[4];
    {
      const int cg = d0 + 4 * (pt % kTokQuadsPerRow);
#pragma unroll
      for (int i = 0; i < 4; ++i) bias[i] = dt_bias[min(cg + i, d_inner - 1)];
    }
    // two register tiles in turn, so a tile's loads fly while the other is staged (a copy from one to the other
    // would wait for the loads at every item)
    TokScanTile<T, 1> ta, tb;
    auto load = [&](TokScanTile<T, 1>& r, long long k) {
      const long long b = blockIdx.y + (k / ntiles) * gridDim.y, l0 = (k % ntiles) * kTokSteps;
      tok_scan_load<T, 1>(r, u, dt, xz, x_dbl, b, L, l0, d0, d_inner, d_state, dt_rank, x_dbl_stride, vec, pt);
    };
    auto produce = [&](const TokScanTile<T, 1>& r, long long k) {
      if (k >= kTokWsStages) tok_bar_sync(empty(k), kPair);  // the scan warps are done with item k - stages
      tok_scan_stage<T, 1>(r, sm, (int)(k % kTokWsStages), bias, pt);
      tok_bar_arrive(full(k), kPair);
    };
    if (g < items) load(ta, g);
    for (long long k = g; k < items; k += 2 * kGroups) {
      const long long k2 = k + kGroups;
      if (k2 < items) load(tb, k2);
      produce(ta, k);
      if (k2 >= items) break;
      if (k2 + kGroups < items) load(ta, k2 + kGroups);
      produce(tb, k2);
    }
    return;
  }
  {  // the scan warps: lane r of channel c is thread 8 c + r
    const int c = threadIdx.x / 8, r = threadIdx.x % 8, j = r / 2, e = r % 2, n0 = 4 * j + 2 * e;
    const int d = d0 + c;
    const bool dvalid = d < d_inner;
    const int dl = min(d, d_inner - 1);
    const float Dd = Dp[dl];
    float a2[2], h[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float al = n0 + i < d_state ? A_log[(long long)dl * d_state + n0 + i] : 0.f;
      a2[i] = -scan_exp2(fmaf(al, kLog2e, kLog2Log2e));
    }
    for (long long k = 0; k < items; ++k) {
      const long long b = blockIdx.y + (k / ntiles) * gridDim.y, tile = k % ntiles, l0 = tile * kTokSteps;
      float* srow = state + ((long long)b * d_inner + dl) * d_state;
      if (tile == 0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) h[i] = (dvalid && n0 + i < d_state) ? srow[n0 + i] : 0.f;
      }
      const int buf = (int)(k % kTokWsStages);
      T* orow = out + (long long)b * L * d_inner + d;
      auto emit = [&](int l, float acc) {
        const float2 v = sm.us[buf][l][c];
        float y = fmaf(Dd, v.x, acc);
        y *= v.y;
        orow[(l0 + l) * d_inner] = from_f32<T>(y);
      };
      auto step = [&](int l) {  // one timestep: the recurrence of this lane's states and its part of the chain
        const float2 dd = sm.dd[buf][l][c];
        const float2 bq = *reinterpret_cast<const float2*>(&sm.bc[buf][l][n0]);
        const float2 cq = *reinterpret_cast<const float2*>(&sm.bc[buf][l][16 + n0]);
        h[0] = fmaf(scan_exp2(dd.x * a2[0]), h[0], dd.y * bq.x);
        h[1] = fmaf(scan_exp2(dd.x * a2[1]), h[1], dd.y * bq.y);
        return tok_chain8(h, cq, e);
      };
      tok_bar_sync(full(k), kPair);
      const int steps = (int)min((long long)kTokSteps, L - l0);
      if (steps == kTokSteps) {
        // two passes, as tok_scan_tile1: the recurrence and chain parts of all 16 steps, then their sums
        float pk[kTokSteps];
#pragma unroll
        for (int l = 0; l < kTokSteps; ++l) pk[l] = step(l);
#pragma unroll
        for (int l = 0; l < kTokSteps; ++l) pk[l] = tok_sums8(pk[l]);
        if (dvalid && e) {
#pragma unroll
          for (int g = 0; g < kTokSteps; g += 4) {
            const float mine = j == 0 ? pk[g] : j == 1 ? pk[g + 1] : j == 2 ? pk[g + 2] : pk[g + 3];
            emit(g + j, mine);
          }
        }
      } else {
#pragma unroll 1
        for (int l = 0; l < steps; ++l) {
          const float acc = tok_sums8(step(l));
          if (dvalid && r == 1) emit(l, acc);
        }
      }
      if (k + kTokWsStages < items) tok_bar_arrive(empty(k), kPair);
      if (tile == ntiles - 1 && dvalid) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
          if (n0 + i < d_state) srow[n0 + i] = h[i];
      }
    }
  }
}

// ---- the causal conv1d ---------------------------------------------------------------------------------------
// out[b, l, c] = silu(bias[c] + sum_k w[c, k] x[b, l - (width-1) + k, c]) with x = xz[:, :d] (row stride 2 d), in
// conv1d_step_w's arithmetic (window widened to f64, conv_dot, mf::silu: a whole tile's outputs through silu_n, the
// same bits); positions before 0 come from
// conv_state [b, c, width-1] (oldest first), the previous chunk's last inputs (zeros for a fresh sequence).
// Thread: one channel, kTokConvSteps consecutive timesteps (consecutive threads: consecutive channels, so each
// timestep's loads and stores are coalesced). In place safe: only the thread of a channel's first tile reads
// conv_state, and that thread alone writes the new state (the last width-1 inputs, read from x) after its reads.
constexpr int kTokConvSteps = 32;
constexpr int kTokConvBlock = 128;
static_assert(kTokConvSteps % 4 == 0, "a tile's outputs go through silu_n four at a time");

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
    // four outputs at a time through silu_n (mf::silu's bits without a slow-path branch per value)
#pragma unroll
    for (int i = 0; i < kTokConvSteps; i += 4) {
      float pre[4], y[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int k = 0; k + 1 < W; ++k) win[k] = win[k + 1];
        win[W - 1] = (double)to_f32(xv[i + j]);
        pre[j] = conv_dot<W>(w, win, bc);
      }
      silu_n<4>(y, pre);
#pragma unroll
      for (int j = 0; j < 4; ++j) out[(b * L + l0 + i + j) * d + c] = from_f32<T>(y[j]);
    }
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

// PDL_BLOCKS: mf::pdl_enter's (the decode chain launches it behind in_proj's GEMM where the vectorised conv does not
// serve: batch below ~100 at d_inner 2048).
template <typename T, int PDL_BLOCKS = 0>
MF_DEVICE void conv1d_tokens(T* __restrict__ out, T* __restrict__ conv_state, const T* __restrict__ xz,
                             const float* __restrict__ weight, const float* __restrict__ bias, int batch, int d,
                             long long L, int width) {
  const int c = blockIdx.x * kTokConvBlock + threadIdx.x;
  if (c >= d || L < 1) return;
  for (long long b = blockIdx.z; b < batch; b += gridDim.z) {
    for (long long l0 = (long long)blockIdx.y * kTokConvSteps; l0 < L; l0 += (long long)gridDim.y * kTokConvSteps) {
      pdl_enter<PDL_BLOCKS>();  // before the first access (again per tile: a no-op; placed here, f32 spills none)
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

// ---- the conv over a few timesteps (decode): conv1d_tokens' contract and bits, vectorised ----
// A decode step (L = 1) of conv1d_tokens is one output per thread behind a kernel that holds a 32-timestep tile in
// registers (96 registers, 5 blocks an SM: a batch-256 step is 6 waves of one round trip each). Here a thread
// takes kTokConvVecCh = 4 consecutive channels of one batch row and walks the L timesteps itself, each output in
// conv1d_tokens_w's arithmetic (conv_dot on the f64-widened window, mf::silu), so the bits are the same. Every
// load is issued before the first output (one round trip): the state's width-1 inputs of the 4 channels as
// width-1 Quads, x as one, the taps as width float4s, the bias as one (4 channels: 8 would need 146 registers, and
// taps loaded where they are used cost a round trip each). Quads where d % 4 == 0 and the pointers are aligned,
// element by element otherwise. In place safe: the thread that reads a (row, channel)'s state writes it, after.
// The op serves small L from it (runtime/torch_ops.py conv_tokens_vec_serves).
constexpr int kTokConvVecCh = 4;
constexpr int kTokConvVecBlock = 128;

template <typename T, int W>
MF_DEVICE void conv1d_tokens_vec_w(T* __restrict__ out, T* __restrict__ conv_state, const T* __restrict__ xz,
                                   const float* __restrict__ weight, const float* __restrict__ bias, long long b,
                                   int c0, int d, long long L, bool vec) {
  constexpr int CH = kTokConvVecCh;
  static_assert(CH == 4, "one Quad of channels");
  const int nc = min(CH, d - c0);
  T win[W][CH];  // win[k][j]: channel c0 + j's input at l - (W-1) + k (win[W-1] the current one)
  T* st = conv_state + ((long long)b * d + c0) * (W - 1);  // [channel][k], oldest first: W-1 Quads
  float wt[CH][W], bs[CH];
  if (vec) {
    if constexpr (W > 1) {
      Quad<T> sq[W - 1];
#pragma unroll
      for (int q = 0; q + 1 < W; ++q) sq[q] = reinterpret_cast<const Quad<T>*>(st)[q];
#pragma unroll
      for (int j = 0; j < CH; ++j)
#pragma unroll
        for (int k = 0; k + 1 < W; ++k) win[k][j] = sq[(j * (W - 1) + k) / 4].v[(j * (W - 1) + k) % 4];
    }
#pragma unroll
    for (int q = 0; q < W; ++q) {  // channel-major taps: element 4q + i is channel (4q + i) / W, tap (4q + i) % W
      const float4 f = reinterpret_cast<const float4*>(weight + (long long)c0 * W)[q];
      const float fv[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) wt[(4 * q + i) / W][(4 * q + i) % W] = fv[i];
    }
    const float4 f = *reinterpret_cast<const float4*>(bias + c0);
    bs[0] = f.x, bs[1] = f.y, bs[2] = f.z, bs[3] = f.w;
  } else {  // element by element; every index static (no local memory)
#pragma unroll
    for (int j = 0; j < CH; ++j) {
#pragma unroll
      for (int k = 0; k + 1 < W; ++k) win[k][j] = j < nc ? st[j * (W - 1) + k] : from_f32<T>(0.f);
#pragma unroll
      for (int k = 0; k < W; ++k) wt[j][k] = j < nc ? weight[(long long)(c0 + j) * W + k] : 0.f;
      bs[j] = j < nc ? bias[c0 + j] : 0.f;
    }
  }
  const long long xs = 2LL * d;
  for (long long l = 0; l < L; ++l) {
    const T* xp = xz + (b * L + l) * xs + c0;
    T* op = out + (b * L + l) * d + c0;
    if (vec) {
      const Quad<T> xq = *reinterpret_cast<const Quad<T>*>(xp);
#pragma unroll
      for (int j = 0; j < CH; ++j) win[W - 1][j] = xq.v[j];
    } else {
#pragma unroll
      for (int j = 0; j < CH; ++j) win[W - 1][j] = j < nc ? xp[j] : from_f32<T>(0.f);
    }
    float pre[CH], y[CH];
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      double w[W], x[W];
#pragma unroll
      for (int k = 0; k < W; ++k) w[k] = wt[j][k], x[k] = (double)to_f32(win[k][j]);
      pre[j] = conv_dot<W>(w, x, (double)bs[j]);
    }
    silu_n<CH>(y, pre);  // mf::silu's bits without a slow-path branch per value
    Quad<T> o;
#pragma unroll
    for (int j = 0; j < CH; ++j) o.v[j] = from_f32<T>(y[j]);
    if (vec) {
      *reinterpret_cast<Quad<T>*>(op) = o;
    } else {
#pragma unroll
      for (int j = 0; j < CH; ++j)
        if (j < nc) op[j] = o.v[j];
    }
#pragma unroll
    for (int k = 0; k + 1 < W; ++k)
#pragma unroll
      for (int j = 0; j < CH; ++j) win[k][j] = win[k + 1][j];
  }
  if constexpr (W > 1) {  // the new state: the last W-1 inputs, now win[0..W-2]
    if (vec) {
      Quad<T> sq[W - 1];
#pragma unroll
      for (int j = 0; j < CH; ++j)
#pragma unroll
        for (int k = 0; k + 1 < W; ++k) sq[(j * (W - 1) + k) / 4].v[(j * (W - 1) + k) % 4] = win[k][j];
#pragma unroll
      for (int q = 0; q + 1 < W; ++q) reinterpret_cast<Quad<T>*>(st)[q] = sq[q];
    } else {
#pragma unroll
      for (int j = 0; j < CH; ++j)
        if (j < nc)
#pragma unroll
          for (int k = 0; k + 1 < W; ++k) st[j * (W - 1) + k] = win[k][j];
    }
  }
}

// PDL_BLOCKS: mf::pdl_enter's (the decode chain launches it behind in_proj's GEMM with programmatic dependent launch).
template <typename T, int PDL_BLOCKS = 0>
MF_DEVICE void conv1d_tokens_vec(T* __restrict__ out, T* __restrict__ conv_state, const T* __restrict__ xz,
                                 const float* __restrict__ weight, const float* __restrict__ bias, int batch, int d,
                                 long long L, int width) {
  pdl_enter<PDL_BLOCKS>();
  const int c0 = (blockIdx.x * kTokConvVecBlock + threadIdx.x) * kTokConvVecCh;
  if (c0 >= d || L < 1) return;
  // d % 4 == 0 keeps every row's Quads aligned once the bases are: 16 bytes for the f32 taps and bias
  const bool vec = d % kTokConvVecCh == 0 && aligned_quad(out) && aligned_quad(xz) && aligned16(weight) &&
                   aligned16(bias) && (width == 1 || aligned_quad(conv_state));
  for (long long b = blockIdx.y; b < batch; b += gridDim.y) {
    switch (width) {
      case 1: conv1d_tokens_vec_w<T, 1>(out, conv_state, xz, weight, bias, b, c0, d, L, vec); break;
      case 2: conv1d_tokens_vec_w<T, 2>(out, conv_state, xz, weight, bias, b, c0, d, L, vec); break;
      case 3: conv1d_tokens_vec_w<T, 3>(out, conv_state, xz, weight, bias, b, c0, d, L, vec); break;
      case 4: conv1d_tokens_vec_w<T, 4>(out, conv_state, xz, weight, bias, b, c0, d, L, vec); break;
      default: return;
    }
  }
}

}  // namespace mf
