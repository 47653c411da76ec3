// The causal conv1d's one per-output formula, shared by the channel-major kernels (kernels/fixed/conv1d.cu) and
// the token-major ones (mf/tokens.cuh), so a forward and a step give the same bits.
#pragma once
#include "mf/common.cuh"

namespace mf {

// The one per-output formula. xs: W consecutive inputs, oldest first. Callers convert each input to f64 once
// (f32 -> f64 is exact; conversions run at a quarter of the f64 arithmetic rate, so not once per use).
// fma(w, x, acc) == acc + w*x rounded once == __dadd_rn(acc, __dmul_rn(w, x)) bit for bit: w and x are f32
// values, so their product is exact in f64 (48 significant bits, exponent in [-298, 256]); one DFMA instead of
// DMUL + DADD halves the f64 work without changing a bit (the host walk, which rounds the sum, checks it).
template <int W> MF_DEVICE float conv_dot(const double* w, const double* xs, double bias) {
  double acc = bias;
#pragma unroll
  for (int k = 0; k < W; ++k) acc = __fma_rn(w[k], xs[k], acc);
  return (float)acc;
}

// mf::silu of N values, bit for bit, without a branch per value. mf::sigmoid's 1.f / y (y = 1 + expf(-z)) is
// rcp.rn.f32, which ptxas expands to MUFU.RCP + one FMA Newton step when y's exponent is in range and to a
// slow-path call otherwise; per value that branch (with its convergence barrier) costs more than the arithmetic.
// Here: y < 2^126 (true for every y >= 1 in the fast range; false for inf/NaN and huge y) for all N values ->
// the same fast-path sequence inline; else the library expression for all N. conv1d_step keeps mf::silu, so
// the GPU test step == forward checks this equality (and the token conv's emulation, built on the host, takes the
// library expression: no PTX there).
template <int N> MF_DEVICE void silu_n(float* out, const float* z) {
  float y[N];
  bool fast = true;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    y[j] = 1.f + expf(-z[j]);
    fast = fast && y[j] < 0x1p126f;
  }
#ifdef __CUDA_ARCH__
  if (fast) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      float r;
      asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y[j]));
      const float t = __fmaf_rn(y[j], r, -1.f);  // exact: y*r is within 2^-22 of 1
      out[j] = z[j] * __fmaf_rn(r, -t, r);
    }
  } else
#else
  (void)fast;
#endif
  {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = silu(z[j]);
  }
}

}  // namespace mf
