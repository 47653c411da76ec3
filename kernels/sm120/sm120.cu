// Blackwell GeForce (sm_120a) GEMM module: symbols instantiated by kernels/sm120/sm120.toml from the portable
// tile GEMMs (MF_TILE_MMA_NN, MF_TILE_TF32_NN, MF_TILE_FMA_NN, MF_TILE_FMA_BIAS_NN).
#include "mf/tile_mma.cuh"
#include "mf/tile_tf32.cuh"
#include "mf/tile_fma.cuh"
