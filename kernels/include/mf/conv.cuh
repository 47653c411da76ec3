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

}  // namespace mf
