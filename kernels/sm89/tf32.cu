// Ada (sm_89) TF32 GEMM module: symbols instantiated by kernels/sm89/tf32.toml from
// kernels/sm89/tile_tf32.cu (composed before this file).
