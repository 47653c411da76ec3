// Activation kernels: softplus forward/backward and the softplus copy, instantiated per dtype by the catalog
// (kernels/fixed/activation.toml: its params and bounds give each symbol's extern "C" wrapper, which calls the body
// the family names). All three are elementwise over a flat n, computed in f32, 16-byte vectorized with a scalar
// tail, 2-4 chunks per thread per tile: forward and backward are the flat maps of mf/elementwise.cuh (mf::map1,
// mf::map2) with the ops below; the copy (mf::softplus_copy) writes two outputs.
#include "mf/common.cuh"
#include "mf/elementwise.cuh"

namespace mf {

// d/dx softplus(x) with torch's threshold: 1 above 20 (where the forward is the identity), else sigmoid(x).
MF_DEVICE float softplus_grad(float x) { return x > 20.f ? 1.f : sigmoid(x); }

struct OpSoftplus { static MF_DEVICE float f(float x) { return softplus(x); } };
struct OpSoftplusGrad { static MF_DEVICE float f(float dy, float x) { return dy * softplus_grad(x); } };

// y[i] = softplus(x[i]) and x_saved[i] = x[i] in one pass: the forward keeps the pre-activation for the
// backward without a second read of x.
template <typename T>
MF_DEVICE void softplus_copy(T* __restrict__ y, T* __restrict__ x_saved, const T* __restrict__ x, i64 n) {
  // Sized as if it loaded two arrays: the chunks and their softplus are both live (4 chunks of bf16 need 80 registers).
  constexpr int W = 8, U = flat_chunks<W>(2 * W * (int)sizeof(T));
  const bool vec = aligned16(y) && aligned16(x_saved) && aligned16(x);
  // The tile loop written out, not flat_tiles: through the lambda ptxas scheduled this kernel differently.
  const i64 span = tile_span<W>();
  for (i64 t0 = first_tile<W, U>(); t0 < n; t0 += tile_stride<W, U>()) {
    const i64 i0 = tile_thread_start<W>(t0);
    float v[U][W], s[U][W];
    load_group<U, W>(i0, span, n, vec, v, x, vec);
#pragma unroll
    for (int j = 0; j < U; ++j)
#pragma unroll
      for (int k = 0; k < W; ++k) s[j][k] = softplus(v[j][k]);
    store_each(x_saved, v, i0, span, n, vec);  // exact: a T value round-trips through f32 unchanged
    store_each(y, s, i0, span, n, vec);
  }
}

}  // namespace mf
