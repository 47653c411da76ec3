// Token-major sequence kernels of the Mamba-1 layer (prefill and decode: the same kernels, so the same bits):
// the code is in kernels/include/mf/tokens.cuh; catalog: kernels/fixed/tokens.toml.
#include "mf/tokens.cuh"

// ssm_scan_tokens: blocks of mf::kTokThreads (16 channels x 4 lanes); grid (channel blocks, batch rows).
#define MF_SSM_SCAN_TOKENS(NAME, T) \
  extern "C" __global__ void __launch_bounds__(mf::kTokThreads, mf::kTokMinBlocks) NAME(T* __restrict__ out, float* __restrict__ state, \
      const T* __restrict__ u, const T* __restrict__ dt, const float* __restrict__ dt_bias, \
      const float* __restrict__ A_log, const T* __restrict__ x_dbl, const float* __restrict__ Dp, \
      const T* __restrict__ xz, int batch, int d_inner, int d_state, int dt_rank, long long L) { \
    mf::ssm_scan_tokens<T>(out, state, u, dt, dt_bias, A_log, x_dbl, Dp, xz, batch, d_inner, d_state, dt_rank, L); \
  }

// conv1d_tokens_silu: blocks of mf::kTokConvBlock channels; grid (channel blocks, timestep tiles, batch rows).
#define MF_CONV1D_TOKENS_SILU(NAME, T) \
  extern "C" __global__ void __launch_bounds__(mf::kTokConvBlock) NAME(T* __restrict__ out, T* __restrict__ conv_state, \
      const T* __restrict__ xz, const float* __restrict__ weight, const float* __restrict__ bias, int batch, int d, \
      long long L, int width) { \
    mf::conv1d_tokens<T>(out, conv_state, xz, weight, bias, batch, d, L, width); \
  }
