// Shared device helpers for every mamba-forge module: dtype conversion, vector access, fixed-order reductions.
// Determinism rule for everything here: no floating-point atomics; every reduction has one fixed order.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define MF_DEVICE __device__ __forceinline__
// A kernel's dynamic shared memory (the size its catalog entry's launch.dynamic_smem declares); a macro so the
// host emulation of the tests can give it a block-wide buffer.
#define MF_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]

namespace mf {

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;

// ---- scalar conversion: every typed kernel computes in f32 and converts at load/store ----
MF_DEVICE float to_f32(float x) { return x; }
MF_DEVICE float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
MF_DEVICE float to_f32(__half x) { return __half2float(x); }

template <typename T> MF_DEVICE T from_f32(float x);
template <> MF_DEVICE float from_f32<float>(float x) { return x; }
template <> MF_DEVICE __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> MF_DEVICE __half from_f32<__half>(float x) { return __float2half_rn(x); }

// Two f32 values rounded to a 16-bit T (nearest even) and packed low, high into one 32-bit word: the epilogues'
// paired column stores (wgmma, tcgen05).
template <typename T> MF_DEVICE u32 pack2(float a, float b);
template <> MF_DEVICE u32 pack2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<u32*>(&v);
}
template <> MF_DEVICE u32 pack2<__half>(float a, float b) {
  __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<u32*>(&v);
}

// Tile t of the grouped order -> (row tile, column tile): GROUP_M row tiles walk the column tiles together (L2
// reuse of B). Depends only on t and the matrix shape, never on which CTA asks.
template <int GROUP_M> MF_DEVICE void grouped_tile_coords(int t, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int per_group = GROUP_M * tiles_n;
  const int group = t / per_group;
  const int first_m = group * GROUP_M;
  const int rows_in_group = min(tiles_m - first_m, GROUP_M);
  const int r = t - group * per_group;
  tm = first_m + r % rows_in_group;
  tn = r / rows_in_group;
}

// ---- 16-byte vectors: VEC<T>::N elements of T moved as one uint4 ----
template <typename T> struct Vec {
  static constexpr int N = 16 / sizeof(T);
  union { uint4 raw; T v[16 / sizeof(T)]; };
};

template <typename T> MF_DEVICE Vec<T> load_vec(const T* p) {  // p must be 16-byte aligned
  Vec<T> r;
  r.raw = *reinterpret_cast<const uint4*>(p);
  return r;
}
template <typename T> MF_DEVICE void store_vec(T* p, const Vec<T>& r) { *reinterpret_cast<uint4*>(p) = r.raw; }

MF_DEVICE bool aligned16(const void* p) { return (reinterpret_cast<u64>(p) & 15ull) == 0; }

// ---- programmatic dependent launch (sm_90+) ----
// A kernel whose catalog launch declares pdl_max_blocks may be launched with the programmatic-serialization attribute:
// its blocks may then start while the grid before it on the stream is still running, so its launch latency hides
// behind that grid's tail. pdl_wait() blocks until that grid has completed and its memory is visible: call it before
// the first global load or store (an input may be what that grid wrote; a weight what an optimiser step wrote).
// pdl_launch_dependents() lets the next such grid start launching (its own pdl_wait still waits for all of this one).
// Without the attribute, and before sm_90 or on the host (the emulation tests), both do nothing.
MF_DEVICE void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
MF_DEVICE void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// A kernel built for PDL on grids of at most PDL_BLOCKS blocks (its catalog instance's PDL_BLOCKS, also its
// launch.pdl_max_blocks): such a grid may have been launched early, so it waits before any global access and then
// lets the next grid launch. A larger grid never is, and skips both: there the next grid's blocks, launched early,
// would take the slots of this grid's later waves (executed in every block of a several-wave grid they cost 20-30%:
// the decode step at batch 64 and 256, kernels/include/mf/decode.cuh). PDL_BLOCKS = 0: no instruction at all.
template <int PDL_BLOCKS> MF_DEVICE void pdl_enter() {
  if (PDL_BLOCKS > 0 && (long long)gridDim.x * gridDim.y * gridDim.z <= PDL_BLOCKS) {
    pdl_wait();
    pdl_launch_dependents();
  }
}

// ---- math in the Mamba reference's conventions ----
MF_DEVICE float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }  // threshold 20, as torch
MF_DEVICE float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
MF_DEVICE float silu(float x) { return x * sigmoid(x); }

// ---- fixed-order reductions ----
// Butterfly over a full warp: every lane ends with the same value, the order is fixed by lane ids.
MF_DEVICE float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
MF_DEVICE double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block sum with a fixed order: warp butterflies, then warp 0 folds the per-warp partials in warp order.
// `scratch` needs blockDim.x/32 elements of shared memory. All threads receive the result.
template <typename A> MF_DEVICE A block_sum(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  A t = lane < nwarps ? scratch[lane] : A(0);
  t = warp_sum(t);
  return t;
}

}  // namespace mf
