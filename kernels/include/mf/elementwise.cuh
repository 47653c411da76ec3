// Chunked element access for the memory-bound families (activation, norm, elementwise).
// A thread works on chunks of W consecutive elements. With W = 8 and every pointer 16-byte aligned, a full
// chunk moves as 16-byte vectors (one uint4 for 2-byte types, two for f32); a partial chunk (the tail) or a
// misaligned pointer falls back to bounds-checked scalar accesses. Both paths hand the same f32 values to the
// same arithmetic, so a result never depends on which path loaded it. W = 1 is the plain scalar form.
#pragma once
#include "mf/common.cuh"

namespace mf {

MF_DEVICE i64 global_thread() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }
MF_DEVICE i64 grid_threads() { return (i64)gridDim.x * blockDim.x; }

// v[k] = p[i0 + k] for i0 + k < n, else 0. `vec`: every chunk start p + i0 is 16-byte aligned.
template <int W, typename T> MF_DEVICE void load_chunk(float (&v)[W], const T* __restrict__ p, i64 i0, i64 n, bool vec) {
  if (W > 1 && vec && i0 + W <= n) {
    constexpr int N = Vec<T>::N;
    static_assert(W == 1 || W % N == 0, "a vector chunk must be whole 16-byte vectors");
#pragma unroll
    for (int j = 0; j < W / N; ++j) {
      const Vec<T> r = load_vec(p + i0 + j * N);
#pragma unroll
      for (int k = 0; k < N; ++k) v[j * N + k] = to_f32(r.v[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = i0 + k < n ? to_f32(p[i0 + k]) : 0.f;
  }
}

// p[i0 + k] = v[k] for i0 + k < n (rounded to nearest even for half types).
template <int W, typename T> MF_DEVICE void store_chunk(T* __restrict__ p, const float (&v)[W], i64 i0, i64 n, bool vec) {
  if (W > 1 && vec && i0 + W <= n) {
    constexpr int N = Vec<T>::N;
#pragma unroll
    for (int j = 0; j < W / N; ++j) {
      Vec<T> r;
#pragma unroll
      for (int k = 0; k < N; ++k) r.v[k] = from_f32<T>(v[j * N + k]);
      store_vec(p + i0 + j * N, r);
    }
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (i0 + k < n) p[i0 + k] = from_f32<T>(v[k]);
  }
}

}  // namespace mf
