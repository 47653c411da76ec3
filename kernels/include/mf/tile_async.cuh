// The cp.async pipeline pieces of the tile GEMMs (mf/tile_mma.cuh, tile_tf32.cuh, tile_tf32_joint.cuh,
// decode_f32.cuh, skinny_f32.cuh) as statement macros: the tile loader and the multi-stage ring. Macros, not
// functions, for one reason: NVVM simplifies a callee on its own before inlining it, and for this code (addresses
// into the stage, the k-loop around the accumulators) that folds the addresses or numbers the registers in
// another order than the code had inline -- the same instructions, other cubin bytes, and every cubin here is
// signed. Pasted tokens compile exactly as the inline code did.
// An expansion names mf::tile's cp_async16, cp_async4, saddr, cp_async_commit and cp_async_wait unqualified: the
// caller is in namespace mf::tile or has them in scope. Only macros here, so a host emulation of a kernel that
// uses them (tests/test_gemm_decode_emulated.py) needs nothing but its own stand-ins for those five.
#pragma once

// The cp.async tile loader of the tile GEMMs: one [ROWS][COLS] tile of a row-major matrix (NR x NC elements of T,
// row stride LD) from (R0, C0) into shared rows of STRIDE elements at DST, spread over THREADS threads from TID,
// V = 16 / sizeof(T) elements per 16-byte chunk. VEC: 16-byte cp.async chunks (LD a multiple of V and a 16-byte
// aligned base, so a chunk lies wholly inside or outside); else CHUNK copies the chunk's elements, the same
// values: MF_CHUNK_CP4 (f32: 4-byte cp.async), MF_CHUNK_CP4_NOOK (the same, the test spelt twice) or
// MF_CHUNK_COPY8 (16-bit: cp.async copies 4 bytes at the least, so plain loads and stores). Zeros outside.
// tile_tf32_joint.cuh's loader was a lambda of its own and keeps being one (mf::tile::load_tile_async).
#define MF_TILE_LOAD_ASYNC(T, DST, SRC, ROWS, COLS, STRIDE, R0, C0, NR, NC, LD, VEC, TID, THREADS, V, CHUNK) \
  for (int c = TID; c < ROWS * COLS / V; c += THREADS) {                                                \
    const int r = c / (COLS / V), cc = (c % (COLS / V)) * V;                                            \
    const int gr = R0 + r, gc = C0 + cc;                                                                \
    T* dst = DST + r * STRIDE + cc;                                                                     \
    if (VEC) {                                                                                          \
      const bool ok = gr < NR && gc < NC;                                                               \
      cp_async16(saddr(dst), ok ? SRC + (i64)gr * LD + gc : SRC, ok);                                   \
    } else {                                                                                            \
      CHUNK(T, dst, SRC, gr, gc, NR, NC, LD)                                                            \
    }                                                                                                   \
  }
#define MF_CHUNK_CP4(T, dst, src, gr, gc, nr, nc, ld)                                                   \
  _Pragma("unroll") for (int j = 0; j < 4; ++j) {                                                       \
    const bool ok = gr < nr && gc + j < nc;                                                             \
    cp_async4(saddr(dst + j), ok ? src + (i64)gr * ld + gc + j : src, ok);                              \
  }
#define MF_CHUNK_CP4_NOOK(T, dst, src, gr, gc, nr, nc, ld)                                              \
  _Pragma("unroll") for (int j = 0; j < 4; ++j)                                                         \
    cp_async4(saddr(dst + j), (gr < nr && gc + j < nc) ? src + (i64)gr * ld + gc + j : src, gr < nr && gc + j < nc);
#define MF_CHUNK_COPY8(T, dst, src, gr, gc, nr, nc, ld)                                                 \
  _Pragma("unroll") for (int j = 0; j < 8; ++j)                                                         \
    dst[j] = (gr < nr && gc + j < nc) ? src[(i64)gr * ld + gc + j] : from_f32<T>(0.f);

// The A rows of the exact-f32 decode and skinny GEMMs (decode_f32.cuh, skinny_f32.cuh): the ROWS rows of A inside M
// (row stride K) from row R0, k-tile columns k0 .. k0 + BK, into shared rows of STRIDE floats at DST; 16-byte
// copies (VEC: K % 4 == 0 and a 16-byte aligned A) or 4-byte ones of the same elements, zeros past K.
#define MF_ROWS_LOAD_ASYNC(DST, STRIDE, A, R0, ROWS, K, k0, BK, VEC, TID, THREADS)                     \
  for (int c = TID; c < ROWS * (BK / 4); c += THREADS) {                                              \
    const int r = c / (BK / 4), q = (c % (BK / 4)) * 4, k = k0 + q;                                    \
    const float* src = A + (i64)(R0 + r) * K + k;                                                      \
    if (VEC) {                                                                                         \
      cp_async16(saddr(DST + r * STRIDE + q), k < K ? src : A, k < K);                                 \
    } else {                                                                                           \
      _Pragma("unroll") for (int j = 0; j < 4; ++j)                                                    \
        cp_async4(saddr(DST + r * STRIDE + q + j), k + j < K ? src + j : A, k + j < K);                \
    }                                                                                                  \
  }

// The cp.async ring. FILL issues the copies of the first STAGES - 1 k-tiles (UNROLL: its loop pragma), one commit
// group per stage, empty or not, so the wait counts stay exact. NEXT, at the top of k-tile kt: wait for the group
// that filled it (this thread's copies), the CTA barrier (everyone's copies are visible, and the stage refilled
// next, consumed at kt - 1, is free), then the copies of k-tile kt + STAGES - 1. IF: a guard on the loads where
// only some threads copy (`loader &&`), else nothing.
#define MF_CP_ASYNC_FILL(STAGES, k_tiles, load_stage, IF, UNROLL) \
  _Pragma(UNROLL) for (int s = 0; s < STAGES - 1; ++s) {          \
    if (IF s < k_tiles) load_stage(s, s);                         \
    cp_async_commit();                                            \
  }
#define MF_CP_ASYNC_NEXT(STAGES, kt, k_tiles, load_stage, IF) \
  cp_async_wait<STAGES - 2>();                                \
  __syncthreads();                                            \
  const int pre = kt + STAGES - 1;                            \
  if (IF pre < k_tiles) load_stage(pre % STAGES, pre);        \
  cp_async_commit();
