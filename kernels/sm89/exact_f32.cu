// Ada (sm_89) exact f32 GEMM module: every symbol is MF_TILE_FMA_NN or MF_TILE_FMA_BIAS_NN (the same chain, then
// + bias[n]) from the portable FFMA tile GEMM, instantiated by kernels/sm89/exact_f32.toml.
#include "mf/tile_fma.cuh"
