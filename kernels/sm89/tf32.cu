// Ada (sm_89) TF32 GEMM module: the portable TF32 tile (MF_TILE_TF32_NN, mf/tile_tf32.cuh) and the TF32-joint
// named variants (MF_TILE_TF32_JOINT and the pre-RNA transpose, mf/tile_tf32_joint.cuh), instantiated by
// kernels/sm89/tf32.toml.
#include "mf/tile_tf32.cuh"
#include "mf/tile_tf32_joint.cuh"
