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

// Load groups: the chunks at i0 + c * span of one or two arrays, given as (v, p, vec) triples in load order: the C
// chunks of W of array p land in v; vec: p may be read with 16-byte vectors. all_vec (every vec, as the caller
// writes the condition) and a whole group: all 16-byte loads are issued in one branch-free block (load_whole);
// otherwise chunk by chunk (load_each). The forms that keep the generated code of the loops written out before
// (checked on the cubins of every target): plain argument lists and the caller's own condition. A struct of array
// references, the condition folded here, or three arrays (rmsnorm_backward: on sm_100a/sm_120a) changed it.
MF_DEVICE void group_load_whole(i64, i64) {}
template <int C, int W, typename T, typename... R>
MF_DEVICE void group_load_whole(i64 i0, i64 span, float (&v)[C][W], const T* __restrict__ p, bool, R&&... rest) {
  load_whole(v, p, i0, span);
  group_load_whole(i0, span, rest...);
}
MF_DEVICE void group_load_each(i64, i64, i64) {}
template <int C, int W, typename T, typename... R>
MF_DEVICE void group_load_each(i64 i0, i64 span, i64 n, float (&v)[C][W], const T* __restrict__ p, bool vec,
                               R&&... rest) {
  load_each(v, p, i0, span, n, vec);
  group_load_each(i0, span, n, rest...);
}
template <int C, int W, typename... A>
MF_DEVICE void load_group(i64 i0, i64 span, i64 n, bool all_vec, A&&... arrays) {
  if (group_whole<C, W>(all_vec, i0, span, n)) {
    group_load_whole(i0, span, arrays...);
  } else {
    group_load_each(i0, span, n, arrays...);
  }
}

struct OpAdd { static MF_DEVICE float f(float a, float b) { return a + b; } };  // for apply and the maps

// u[c][k] = Op::f(u[c][k], v[c][k]...) over a group, in place.
template <typename Op, int C, int W, typename... V> MF_DEVICE void apply(float (&u)[C][W], const V&... v) {
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int k = 0; k < W; ++k) u[c][k] = Op::f(u[c][k], v[c][k]...);
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

// ---- flat maps over n elements, shared by the activation and elementwise families ----
// The tile loop: body(i0, span) handles this thread's U chunks of W at i0 + c * span, tile after tile. The maps
// below compile through it to the cubins of their former written-out loops; softplus_copy did not (it keeps its own).
template <int W, int U, typename F> MF_DEVICE void flat_tiles(i64 n, F&& body) {
  const i64 span = tile_span<W>();
  for (i64 t0 = first_tile<W, U>(); t0 < n; t0 += tile_stride<W, U>()) body(tile_thread_start<W>(t0), span);
}

// out[i] = Op::f(a[i]).
template <int W, typename Op, typename TO, typename TA>
MF_DEVICE void map1(TO* __restrict__ out, const TA* __restrict__ a, i64 n) {
  constexpr int U = flat_chunks<W>(W * (int)sizeof(TA));
  const bool vec = W > 1 && aligned16(out) && aligned16(a);
  flat_tiles<W, U>(n, [&](i64 i0, i64 span) {
    float u[U][W];
    load_group<U, W>(i0, span, n, vec, u, a, vec);
    apply<Op>(u);
    store_each(out, u, i0, span, n, vec);
  });
}

// out[i] = Op::f(a[i], b[i]) with U chunks per thread per tile; out may be a (in place: each element is read and
// then written by the same thread).
template <int W, int U, typename Op, typename TO, typename TA, typename TB>
MF_DEVICE void map2_tiles(TO* out, const TA* a, const TB* b, i64 n, bool vec) {
  flat_tiles<W, U>(n, [&](i64 i0, i64 span) {
    float u[U][W], v[U][W];
    load_group<U, W>(i0, span, n, vec, u, a, vec, v, b, vec);
    apply<Op>(u, v);
    store_each(out, u, i0, span, n, vec);
  });
}

// out[i] = Op::f(a[i], b[i]) over a flat n.
template <int W, typename Op, typename TO, typename TA, typename TB>
MF_DEVICE void map2(TO* __restrict__ out, const TA* __restrict__ a, const TB* __restrict__ b, i64 n) {
  constexpr int U = flat_chunks<W>(W * (int)(sizeof(TA) + sizeof(TB)));
  map2_tiles<W, U, Op>(out, a, b, n, W > 1 && aligned16(out) && aligned16(a) && aligned16(b));
}

// io[i] = Op::f(io[i], b[i]) in place over a flat n.
template <int W, typename Op, typename TO, typename TB>
MF_DEVICE void map2_inplace(TO* __restrict__ io, const TB* __restrict__ b, i64 n) {
  constexpr int U = flat_chunks<W>(W * (int)(sizeof(TO) + sizeof(TB)));
  map2_tiles<W, U, Op>(io, io, b, n, W > 1 && aligned16(io) && aligned16(b));
}

}  // namespace mf
