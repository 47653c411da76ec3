// Ada (sm_89) exact f32 GEMM module: symbols instantiated by kernels/sm89/exact_f32.toml from
// kernels/sm89/tile_fma.cu (composed before this file).
