// Selective-scan helpers (Mamba-1): per-lane item tiles, the affine-pair warp scans, the state capacity.
// Deterministic by construction: every scan and reduction below has one fixed order fixed by lane ids.
#pragma once
#include "mf/common.cuh"

#ifndef MF_STATE_CAP
#define MF_STATE_CAP 64
#endif
static_assert(MF_STATE_CAP % 16 == 0 && MF_STATE_CAP >= 16 && MF_STATE_CAP <= 256, "MF_STATE_CAP: 16..256, x16");

namespace mf {

constexpr float kLog2e = 1.4426950408889634f;
// Timesteps between saved states (the save variants write the state before every such chunk; the backward
// recomputes the forward inside one chunk from it). Equals 32 lanes x 8 items of the backward's tile.
constexpr int kScanSaveChunk = 256;

// 2^x on the SFU with denormal results flushed to zero (exp(delta' A) below 1e-38 is 0 for the scan): one MUFU.EX2,
// without the denormal range fix-up exp2f adds around it. Host builds (the CPU emulation test) use exp2f.
MF_DEVICE float scan_exp2(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// delta' = softplus(delta + bias) (threshold 20) or delta + bias.
MF_DEVICE float scan_delta(float raw, float bias, int softplus_flag) {
  const float x = raw + bias;
  return softplus_flag ? softplus(x) : x;
}
// d softplus(x) / dx with the same threshold.
MF_DEVICE float scan_delta_grad(float raw, float bias, int softplus_flag) {
  const float x = raw + bias;
  return (softplus_flag && x <= 20.f) ? sigmoid(x) : 1.f;
}

// Load NI consecutive elements p[l0 .. l0+NI) as f32 (zero past `len`); 16-byte vector loads when the whole
// tile is in range and aligned, scalar loads otherwise.
template <typename T, int NI> MF_DEVICE void load_items(const T* __restrict__ p, long long l0, long long len, float (&out)[NI]) {
  constexpr int V = 16 / sizeof(T);
  if (NI % V == 0 && l0 + NI <= len && aligned16(p + l0)) {
#pragma unroll
    for (int k = 0; k < NI / V; ++k) {
      const Vec<T> v = load_vec(p + l0 + k * V);
#pragma unroll
      for (int j = 0; j < V; ++j) out[k * V + j] = to_f32(v.v[j]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < NI; ++i) out[i] = (l0 + i < len) ? to_f32(p[l0 + i]) : 0.f;
  }
}

// Store NI values to p[l0 .. l0+NI) as T, only the elements inside `len`.
template <typename T, int NI> MF_DEVICE void store_items(T* __restrict__ p, long long l0, long long len, const float (&in)[NI]) {
  constexpr int V = 16 / sizeof(T);
  if (NI % V == 0 && l0 + NI <= len && aligned16(p + l0)) {
#pragma unroll
    for (int k = 0; k < NI / V; ++k) {
      Vec<T> v;
#pragma unroll
      for (int j = 0; j < V; ++j) v.v[j] = from_f32<T>(in[k * V + j]);
      store_vec(p + l0 + k * V, v);
    }
  } else {
#pragma unroll
    for (int i = 0; i < NI; ++i)
      if (l0 + i < len) p[l0 + i] = from_f32<T>(in[i]);
  }
}

// Affine maps x -> a*x + b composed in time order: first (a1,b1), then (a2,b2) = (a1*a2, a2*b1 + b2).
// Inclusive forward scan over the 32 lanes (Hillis-Steele with shfl_up: a fixed order).
MF_DEVICE void warp_scan_affine_fwd(float& a, float& b, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float pa = __shfl_up_sync(0xffffffffu, a, o);
    const float pb = __shfl_up_sync(0xffffffffu, b, o);
    if (lane >= o) {
      b = a * pb + b;
      a = pa * a;
    }
  }
}

// Inclusive suffix scan of maps x -> s + q*x applied right to left: lane j ends with F_j o F_{j+1} o ... o F_31,
// where F o G = (qF*qG, sF + qF*sG).
MF_DEVICE void warp_scan_affine_rev(float& q, float& s, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float nq = __shfl_down_sync(0xffffffffu, q, o);
    const float ns = __shfl_down_sync(0xffffffffu, s, o);
    if (lane + o < 32) {
      s = s + q * ns;
      q = q * nq;
    }
  }
}

// A scanned channel ch = b * d_inner + d: its batch and channel, the offset of its [L] row in u/delta/z/out, the
// offset of batch b's B/C rows, and its delta bias and skip weight (0 where the pointer is null).
struct ScanChannel {
  long long b;
  int d;
  long long row, bc;
  float bias, Dd;
};
MF_DEVICE ScanChannel scan_channel(long long ch, int d_inner, int d_state, long long L,
                                   const float* __restrict__ delta_bias, const float* __restrict__ Dp) {
  const long long b = ch / d_inner;
  const int d = (int)(ch % d_inner);
  return {b, d, ch * L, b * d_state * L, delta_bias ? delta_bias[d] : 0.f, Dp ? Dp[d] : 0.f};
}

}  // namespace mf
