// Ada (sm_89) TF32 finalist module: the one TF32 tile the Ada tuning kept (MF_TILE_TF32_NN from the portable
// TF32 tile GEMM), instantiated by kernels/sm89/finalist.toml. Its own module, as the registry's
// TriadSm89Finalist kind: when it is not bound, the portable or exact kernels serve every TF32 request.
#include "mf/tile_tf32.cuh"
