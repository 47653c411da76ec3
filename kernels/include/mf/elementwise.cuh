// Chunked element access for the memory-bound families (activation, norm, elementwise).
// A thread works on chunks of W consecutive elements. With W = 8 and every pointer 16-byte aligned, a full
// chunk moves as 16-byte vectors (one uint4 for 2-byte types, two for f32); a partial chunk (the tail) or a
// misaligned pointer falls back to bounds-checked scalar accesses. Both paths hand the same f32 values to the
// same arithmetic, so a result never depends on which path loaded it. W = 1 is the plain scalar form.
//
// Groups: a thread takes C chunks at once, chunk c at i0 + c * span. When the whole group is vectorizable
// (group_whole), load_whole issues every 16-byte load of the group in one branch-free block, before any
// conversion or use waits on the first, so C * W/N loads per array are in flight. A per-chunk branch would
// wait on each chunk before loading the next.
#pragma once
#include "mf/common.cuh"

namespace mf {

MF_DEVICE i64 global_thread() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }
MF_DEVICE i64 grid_threads() { return (i64)gridDim.x * blockDim.x; }

// Flat maps in tiles: a CTA's tile is U * blockDim.x chunks of W elements, grid-stride over tiles. Chunk j of
// thread t starts at tile + t * W + j * blockDim.x * W (a group with i0 = tile + t * W, span = blockDim.x * W),
// so each of a warp's U vector accesses is one contiguous run.
// U: 2 chunks, or 4 when a chunk loads under 32 bytes (one 2-byte input); 1 for the scalar forms (W = 1).
template <int W> __host__ __device__ constexpr int flat_chunks(int load_bytes_per_chunk) {
  return W == 1 ? 1 : load_bytes_per_chunk < 32 ? 4 : 2;
}
template <int W, int U> MF_DEVICE i64 first_tile() { return (i64)blockIdx.x * blockDim.x * W * U; }
template <int W, int U> MF_DEVICE i64 tile_stride() { return (i64)gridDim.x * blockDim.x * W * U; }
template <int W> MF_DEVICE i64 tile_span() { return (i64)blockDim.x * W; }
template <int W> MF_DEVICE i64 tile_thread_start(i64 tile) { return tile + (i64)threadIdx.x * W; }

// True when all C chunks at i0 + c * span are whole (inside n) and vectorizable (`vec`: pointers aligned).
template <int C, int W> MF_DEVICE bool group_whole(bool vec, i64 i0, i64 span, i64 n) {
  return W > 1 && vec && i0 + (C - 1) * span + W <= n;
}

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

// v[c][k] = p[i0 + c * span + k] for a group known whole and aligned (group_whole): all loads, then conversions.
template <int C, int W, typename T>
MF_DEVICE void load_whole(float (&v)[C][W], const T* __restrict__ p, i64 i0, i64 span) {
  if constexpr (W == 1) {  // never whole (group_whole), but the scalar forms still instantiate this
#pragma unroll
    for (int c = 0; c < C; ++c) v[c][0] = to_f32(p[i0 + c * span]);
    return;
  } else {
  constexpr int N = Vec<T>::N;
  static_assert(W % N == 0, "a vector chunk must be whole 16-byte vectors");
  Vec<T> r[C][W / N];
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int j = 0; j < W / N; ++j) r[c][j] = load_vec(p + i0 + c * span + j * N);
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int j = 0; j < W / N; ++j)
#pragma unroll
      for (int k = 0; k < N; ++k) v[c][j * N + k] = to_f32(r[c][j].v[k]);
  }
}

// Any group: chunk by chunk through load_chunk (vector where whole and aligned, else bounds-checked scalars).
template <int C, int W, typename T>
MF_DEVICE void load_each(float (&v)[C][W], const T* __restrict__ p, i64 i0, i64 span, i64 n, bool vec) {
#pragma unroll
  for (int c = 0; c < C; ++c) load_chunk<W>(v[c], p, i0 + c * span, n, vec);
}

// One 16-byte global store, written as PTX so it stays one vector instruction. Through a C++ uint4 store the
// compiler may split an f32 vector back into 4-byte stores (it did in rmsnorm_forward's unrolled loop: eight
// st.global.f32 per chunk, 0.39 of copy bandwidth). p must be 16-byte aligned.
MF_DEVICE void store16(void* p, const uint4& r) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w) : "memory");
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
      store16(p + i0 + j * N, r.raw);
    }
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (i0 + k < n) p[i0 + k] = from_f32<T>(v[k]);
  }
}

// Chunk by chunk through store_chunk: nothing is written at or past n.
template <int C, int W, typename T>
MF_DEVICE void store_each(T* __restrict__ p, const float (&v)[C][W], i64 i0, i64 span, i64 n, bool vec) {
#pragma unroll
  for (int c = 0; c < C; ++c) store_chunk<W>(p, v[c], i0 + c * span, n, vec);
}

}  // namespace mf
