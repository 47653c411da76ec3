// Ada (sm_89) exact f32 GEMM module: every symbol is MF_TILE_FMA_NN from the portable FFMA tile GEMM,
// instantiated by kernels/sm89/exact_f32.toml.
#include "mf/tile_fma.cuh"
