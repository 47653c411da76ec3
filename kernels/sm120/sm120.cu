// Blackwell GeForce (sm_120a) GEMM module: symbols instantiated by kernels/sm120/sm120.toml from the portable
// tile GEMMs in kernels/sm89/tile_{mma,tf32,fma}.cu (composed before this file).
