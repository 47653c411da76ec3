// Shared primitives of the portable tile GEMMs (mf/tile_mma.cuh, mf/tile_tf32.cuh, mf/tile_fma.cuh): cp.async
// with zero fill, ldmatrix, tile order, typed stores.
#pragma once
#include "mf/common.cuh"

namespace mf {
namespace tile {

MF_DEVICE u32 saddr(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

MF_DEVICE void cp_async16(u32 dst, const void* src, bool pred) {  // pred false: 16 zero bytes, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0) : "memory");
}
MF_DEVICE void cp_async4(u32 dst, const void* src, bool pred) {  // pred false: 4 zero bytes, nothing read
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 4 : 0) : "memory");
}
MF_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> MF_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

MF_DEVICE void ldsm_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
MF_DEVICE void ldsm_x4_trans(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// Tile t -> (row tile, column tile). GROUPED: 8 row tiles walk the column tiles together (L2 reuse of B);
// otherwise row-major tile order. Depends only on t and the shape.
template <bool GROUPED> MF_DEVICE void tile_coords(int t, int tiles_m, int tiles_n, int& tm, int& tn) {
  if (GROUPED) {
    grouped_tile_coords<8>(t, tiles_m, tiles_n, tm, tn);
  } else {
    tm = t / tiles_n;
    tn = t % tiles_n;
  }
}

MF_DEVICE void store_out(float* p, float v) { *p = v; }
MF_DEVICE void store_out(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
MF_DEVICE void store_out(__half* p, float v) { *p = __float2half_rn(v); }

}  // namespace tile
}  // namespace mf
