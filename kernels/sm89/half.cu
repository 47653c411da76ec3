// Ada (sm_89) f16/bf16 GEMM module: every symbol is instantiated by kernels/sm89/half.toml from
// kernels/sm89/tile_mma.cu (composed before this file); nothing module-specific is needed here.
