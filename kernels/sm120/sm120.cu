// Blackwell CC 12.x GEMM module (sm_120a, sm_121a; checked on sm_90a): symbols instantiated by
// kernels/sm120/sm120.toml. The gemm_bi_nn_sm120_tma_* tiles load through TMA (mf/tile_tma.cuh: MF_TILE_MMA_NN_TMA,
// MF_TILE_TF32_NN_TMA, MF_TILE_FMA_NN_TMA, MF_TILE_FMA_BIAS_NN_TMA); the copyplan / sliced exact-f32 tiles stay on
// the portable cp.async tile (MF_TILE_FMA_NN, mf/tile_fma.cuh).
#include "mf/tile_mma.cuh"
#include "mf/tile_tf32.cuh"
#include "mf/tile_fma.cuh"
#include "mf/tile_tma.cuh"
