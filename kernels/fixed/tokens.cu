// Token-major sequence kernels of the Mamba-1 layer (prefill and decode: the same kernels, so the same bits):
// the code is in kernels/include/mf/tokens.cuh; catalog: kernels/fixed/tokens.toml, whose params and bounds the
// catalog writes each symbol's extern "C" wrapper from (mamba_forge/catalog/wrappers.py), calling
// mf::ssm_scan_tokens<T> (blocks of mf::kTokThreads: 16 channels x 4 lanes; grid (channel blocks, batch rows)) and
// mf::conv1d_tokens<T> (blocks of mf::kTokConvBlock channels; grid (channel blocks, timestep tiles, batch rows)).
#include "mf/tokens.cuh"
