// Ada (sm_89) exact f32 d128 module: the in- and out-projection GEMMs of a d_model = 128 model on the portable
// FFMA tile GEMM (MF_TILE_FMA_NN, the same fmaf chain over k as every exact-f32 symbol), instantiated by
// kernels/sm89/exact_f32_d128.toml. A module of its own so that it binds (or fails admission) independently of
// the wider exact-f32 module, as the registry's separate TriadSm89ExactF32D128 kind does.
#include "mf/tile_fma.cuh"
