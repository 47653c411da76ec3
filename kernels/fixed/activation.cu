// Activation kernels: softplus forward/backward and the softplus copy. One typed implementation per family,
// instantiated per dtype by the catalog (kernels/fixed/activation.toml).
#include "mf/common.cuh"

namespace mf {

// y[i] = softplus(x[i]) (threshold 20), elementwise over n.
template <typename T> MF_DEVICE void softplus_forward(T* __restrict__ y, const T* __restrict__ x, long long n) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = from_f32<T>(softplus(to_f32(x[i])));
}

}  // namespace mf

#define MF_SOFTPLUS_FORWARD(NAME, T) \
  extern "C" __global__ void __launch_bounds__(256) NAME(T* __restrict__ y, const T* __restrict__ x, long long n) { \
    mf::softplus_forward<T>(y, x, n); \
  }
