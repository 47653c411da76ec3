// Activation kernels: softplus forward/backward and the softplus copy. One typed implementation per family,
// instantiated per dtype by the catalog (kernels/fixed/activation.toml). All three are elementwise over a flat
// n, computed in f32, 16-byte vectorized with a scalar tail (mf/elementwise.cuh).
#include "mf/common.cuh"
#include "mf/elementwise.cuh"

namespace mf {

// d/dx softplus(x) with torch's threshold: 1 above 20 (where the forward is the identity), else sigmoid(x).
MF_DEVICE float softplus_grad(float x) { return x > 20.f ? 1.f : sigmoid(x); }

// y[i] = softplus(x[i]) (threshold 20), elementwise over n.
template <typename T> MF_DEVICE void softplus_forward(T* __restrict__ y, const T* __restrict__ x, i64 n) {
  constexpr int W = 8;
  const bool vec = aligned16(y) && aligned16(x);
  for (i64 i0 = global_thread() * W; i0 < n; i0 += grid_threads() * W) {
    float v[W];
    load_chunk<W>(v, x, i0, n, vec);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = softplus(v[k]);
    store_chunk<W>(y, v, i0, n, vec);
  }
}

// dx[i] = dy[i] * softplus'(x[i]).
template <typename T>
MF_DEVICE void softplus_backward(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x, i64 n) {
  constexpr int W = 8;
  const bool vec = aligned16(dx) && aligned16(dy) && aligned16(x);
  for (i64 i0 = global_thread() * W; i0 < n; i0 += grid_threads() * W) {
    float g[W], v[W];
    load_chunk<W>(g, dy, i0, n, vec);
    load_chunk<W>(v, x, i0, n, vec);
#pragma unroll
    for (int k = 0; k < W; ++k) g[k] = g[k] * softplus_grad(v[k]);
    store_chunk<W>(dx, g, i0, n, vec);
  }
}

// y[i] = softplus(x[i]) and x_saved[i] = x[i] in one pass: the forward keeps the pre-activation for the
// backward without a second read of x.
template <typename T>
MF_DEVICE void softplus_copy(T* __restrict__ y, T* __restrict__ x_saved, const T* __restrict__ x, i64 n) {
  constexpr int W = 8;
  const bool vec = aligned16(y) && aligned16(x_saved) && aligned16(x);
  for (i64 i0 = global_thread() * W; i0 < n; i0 += grid_threads() * W) {
    float v[W], s[W];
    load_chunk<W>(v, x, i0, n, vec);
#pragma unroll
    for (int k = 0; k < W; ++k) s[k] = softplus(v[k]);
    store_chunk<W>(x_saved, v, i0, n, vec);  // exact: a T value round-trips through f32 unchanged
    store_chunk<W>(y, s, i0, n, vec);
  }
}

}  // namespace mf

#define MF_SOFTPLUS_FORWARD(NAME, T) \
  extern "C" __global__ void __launch_bounds__(256) NAME(T* __restrict__ y, const T* __restrict__ x, long long n) { \
    mf::softplus_forward<T>(y, x, n); \
  }
#define MF_SOFTPLUS_BACKWARD(NAME, T) \
  extern "C" __global__ void __launch_bounds__(256) \
  NAME(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x, long long n) { \
    mf::softplus_backward<T>(dx, dy, x, n); \
  }
#define MF_SOFTPLUS_COPY(NAME, T) \
  extern "C" __global__ void __launch_bounds__(256) \
  NAME(T* __restrict__ y, T* __restrict__ x_saved, const T* __restrict__ x, long long n) { \
    mf::softplus_copy<T>(y, x_saved, x, n); \
  }
