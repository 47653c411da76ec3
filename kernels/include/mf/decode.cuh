// Mamba decode step (one token): the candidates of the fused step ssm_step_forward_fused_v (kernels/fixed/scan.toml).
// LANES threads per (b, d) channel (1, 2 or 4), each owning 4/LANES float4 chunks of every 16-state slice:
// lane q owns the states n = 16*s + 4*(q + LANES*k) + j (k < 4/LANES, j < 4), so one load instruction of the
// channel's LANES lanes covers 16*LANES contiguous bytes (LANES = 2: one whole 32-byte sector per lane pair).
// ROWS batch rows per thread share the channel's A = -exp(A_log) (loaded and exponentiated once).
// Grid: x over ceil(d_inner*LANES / blockDim.x) channel blocks, y over ceil(batch/ROWS) row groups (strided past
// 65535); no integer division on the address path. Every load of a slice (state, A_log, B, C) and the channel's
// scalars (u, dt, dt_bias, D, z) is issued before the first arithmetic that consumes one.
// Arithmetic per state element, in this order: a2 = -2^(A_log*log2e + log2(log2e)) (= A*log2e),
// e = 2^(dt'*a2) = exp(dt' A), h = fma(e, h, (dt'u)*B), partial = fma(C, h, partial). Sums: per float4 chunk in
// j order, chunks in a fixed tree, slices in order, then a butterfly over the LANES lanes; one thread's result
// for a row never depends on the batch size, the launch shape or the other rows (no atomics).
#pragma once
#include "mf/common.cuh"
#include "mf/scan.cuh"

namespace mf {

constexpr float kLog2Log2e = 0.52876637294489771f;  // log2(log2(e)): 2^(x log2e + kLog2Log2e) = exp(x) log2e

// Four consecutive elements moved as one vector (16 bytes for f32, 8 for bf16/f16).
template <typename T> struct alignas(4 * sizeof(T)) Quad {
  T v[4];
};

template <typename T> MF_DEVICE bool aligned_quad(const T* p) {
  return (reinterpret_cast<u64>(p) & (u64)(4 * sizeof(T) - 1)) == 0;
}

// p[0 .. 4) as f32: one vector load when `vec` (aligned, all four in range), else scalar loads of the first
// `nv` elements (the rest 0).
template <typename T> MF_DEVICE void load_quad(const T* __restrict__ p, bool vec, int nv, float (&o)[4]) {
  if (vec) {
    const Quad<T> q = *reinterpret_cast<const Quad<T>*>(p);
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = to_f32(q.v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = j < nv ? to_f32(p[j]) : 0.f;
  }
}

// The state's four elements from f32: a 16-bit state (ssm_step_forward_fused_state16) rounded to S (round to
// nearest even), an f32 state as is.
template <typename S> MF_DEVICE void store_quad(S* __restrict__ p, bool vec, int nv, const float (&h)[4]) {
  if (vec) {
    Quad<S> q;
#pragma unroll
    for (int j = 0; j < 4; ++j) q.v[j] = from_f32<S>(h[j]);
    *reinterpret_cast<Quad<S>*>(p) = q;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (j < nv) p[j] = from_f32<S>(h[j]);
  }
}

// One row group's slices. FAST: d_state % 16 == 0 and every pointer aligned, so every chunk is whole and is one
// vector load from per-row base pointers (offsets are immediates); otherwise scalar loads of the elements in range.
// Order (measured on the H200, scripts/probe_decode_latency.py: 1.97 against 2.05 us at batch 1, the same bits):
// every load first, then the gate silu(z) and the output address, which do not wait for the sum, so after the
// butterfly only one fma, one multiply and the store remain on the critical path.
template <typename T, int LANES, int ROWS, bool FUSED, bool FAST, typename S = float>
MF_DEVICE void ssm_step_rows(T* __restrict__ out, S* __restrict__ state, const T* __restrict__ u,
                             const T* __restrict__ dt, float bias, const float* __restrict__ arow,
                             const T* __restrict__ Bbase, const T* __restrict__ Cbase, float Dd, const T* __restrict__ z,
                             int b0, int d, int q, bool dvalid, int batch, int d_inner, int d_state, int bc_stride,
                             int z_stride) {
  constexpr int KC = 4 / LANES;  // float4 chunks per lane per 16-state slice
  const int nslices = (d_state + 15) >> 4;
  bool rv[ROWS];
  long long ch[ROWS];
  float uv[ROWS], dtr[ROWS], zv[ROWS], acc[ROWS];
  S* sp[ROWS];
  const T* bp[ROWS];
  const T* cp[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    rv[r] = dvalid && b0 + r < batch;
    // FAST: a lane outside the launch (channel or row past the end) loads the last valid channel/row instead,
    // so no load is predicated and nothing needs zeroing; it computes garbage it never stores.
    const int bl = FAST ? min(b0 + r, batch - 1) : b0 + r;
    ch[r] = FAST ? (long long)bl * d_inner + d : (rv[r] ? (long long)bl * d_inner + d : 0);
    uv[r] = (FAST || rv[r]) ? to_f32(u[ch[r]]) : 0.f;
    dtr[r] = (FAST || rv[r]) ? to_f32(dt[ch[r]]) : 0.f;
    zv[r] = (FUSED && (FAST || rv[r])) ? to_f32(z[(long long)bl * z_stride + d]) : 0.f;
    acc[r] = 0.f;
    const long long brow = (FAST || rv[r]) ? (long long)bl * bc_stride : 0;
    sp[r] = state + ch[r] * d_state + 4 * q;
    bp[r] = Bbase + brow + 4 * q;
    cp[r] = Cbase + brow + 4 * q;
  }
  const float* ap = arow + 4 * q;
  float al[KC][4], h[ROWS][KC][4], bq[ROWS][KC][4], cq[ROWS][KC][4];
  int nv[KC];
  // every load of slice s, issued together (FAST: one vector load per chunk, nothing predicated)
  auto load_slice = [&](int s) {
#pragma unroll
    for (int k = 0; k < KC; ++k) {
      nv[k] = FAST ? 4 : (dvalid ? min(max(d_state - (16 * s + 4 * (q + LANES * k)), 0), 4) : 0);
      load_quad(ap + 4 * LANES * k, FAST, FAST ? 0 : nv[k], al[k]);
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int k = 0; k < KC; ++k) {
        const int n = rv[r] ? nv[k] : 0;
        load_quad(sp[r] + 4 * LANES * k, FAST, FAST ? 0 : n, h[r][k]);
        load_quad(bp[r] + 4 * LANES * k, FAST, FAST ? 0 : n, bq[r][k]);
        load_quad(cp[r] + 4 * LANES * k, FAST, FAST ? 0 : n, cq[r][k]);
      }
    }
  };
  // slice 0's loads come before the first arithmetic on a loaded value (dt' below), in one basic block, so the
  // step costs one memory round trip: nothing the loads need waits on another load
  load_slice(0);
  float dtv[ROWS], dtu[ROWS], gate[ROWS];
  T* op[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    gate[r] = FUSED ? silu(zv[r]) : 1.f;  // off the sum's path (y * gate: the same bits as before, when it was last)
    op[r] = out + ch[r];
    dtv[r] = FUSED ? softplus(dtr[r] + bias) : dtr[r];
    dtu[r] = dtv[r] * uv[r];
  }
#pragma unroll 1
  for (int s = 0; s < nslices; ++s) {
    // A*log2e, once for every row of the thread
    float a2[KC][4];
#pragma unroll
    for (int k = 0; k < KC; ++k)
#pragma unroll
      for (int j = 0; j < 4; ++j) a2[k][j] = -scan_exp2(fmaf(al[k][j], kLog2e, kLog2Log2e));
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      float part[KC];
#pragma unroll
      for (int k = 0; k < KC; ++k) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          h[r][k][j] = fmaf(scan_exp2(dtv[r] * a2[k][j]), h[r][k][j], dtu[r] * bq[r][k][j]);
        float pk = cq[r][k][0] * h[r][k][0];
#pragma unroll
        for (int j = 1; j < 4; ++j) pk = fmaf(cq[r][k][j], h[r][k][j], pk);
        part[k] = pk;
      }
      float sl = part[0];
      if constexpr (KC == 4) {
        sl = (part[0] + part[1]) + (part[2] + part[3]);
      } else if constexpr (KC == 2) {
        sl = part[0] + part[1];
      }
      acc[r] += sl;
#pragma unroll
      for (int k = 0; k < KC; ++k) {
        if (FAST) {
          if (rv[r]) store_quad(sp[r] + 4 * LANES * k, true, 4, h[r][k]);
        } else {
          store_quad(sp[r] + 4 * LANES * k, false, rv[r] ? nv[k] : 0, h[r][k]);
        }
      }
    }
    if (s + 1 < nslices) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        sp[r] += 16;
        bp[r] += 16;
        cp[r] += 16;
      }
      ap += 16;
      load_slice(s + 1);
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    // fixed butterfly over the channel's lanes (a + b == b + a bitwise: every lane ends with the same sum)
#pragma unroll
    for (int o = 1; o < LANES; o <<= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (rv[r] && q == 0) *op[r] = from_f32<T>(fmaf(Dd, uv[r], acc[r]) * gate[r]);
  }
}

// The general path (d_state % 16 != 0 or unaligned rows): the same arithmetic and the same summation order as
// ssm_step_rows (so the same bits), with scalar loads, one chunk at a time (few registers: the fast path's
// occupancy is not paid for by this one).
template <typename T, int LANES, int ROWS, bool FUSED, typename S = float>
MF_DEVICE void ssm_step_rows_general(T* __restrict__ out, S* __restrict__ state, const T* __restrict__ u,
                                     const T* __restrict__ dt, float bias, const float* __restrict__ arow,
                                     const T* __restrict__ Bbase, const T* __restrict__ Cbase, float Dd,
                                     const T* __restrict__ z, long long b0, int d, int q, bool dvalid, int batch,
                                     int d_inner, int d_state, int bc_stride, int z_stride) {
  constexpr int KC = 4 / LANES;
  const int nslices = (d_state + 15) >> 4;
#pragma unroll 1
  for (int r = 0; r < ROWS; ++r) {
    const bool rv = dvalid && b0 + r < batch;
    const long long ch = rv ? (b0 + r) * d_inner + d : 0;
    const float uv = rv ? to_f32(u[ch]) : 0.f;
    const float dtr = rv ? to_f32(dt[ch]) : 0.f;
    const float zv = (FUSED && rv) ? to_f32(z[(b0 + r) * z_stride + d]) : 0.f;
    const float dtv = FUSED ? softplus(dtr + bias) : dtr;
    const float dtu = dtv * uv;
    const T* brow = Bbase + (rv ? (b0 + r) * bc_stride : 0);
    const T* crow = Cbase + (rv ? (b0 + r) * bc_stride : 0);
    S* srow = state + ch * d_state;
    float acc = 0.f;
#pragma unroll 1
    for (int s = 0; s < nslices; ++s) {
      float t01 = 0.f, cur = 0.f;  // the chunk tree of the fast path, ((p0 + p1) + (p2 + p3)), built on the fly
#pragma unroll 1
      for (int k = 0; k < KC; ++k) {
        const int n0 = 16 * s + 4 * (q + LANES * k);
        const int nv = rv ? min(max(d_state - n0, 0), 4) : 0;
        float al[4], h[4], bq[4], cq[4];
        load_quad(arow + n0, false, nv, al);
        load_quad(srow + n0, false, nv, h);
        load_quad(brow + n0, false, nv, bq);
        load_quad(crow + n0, false, nv, cq);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float a2 = -scan_exp2(fmaf(al[j], kLog2e, kLog2Log2e));
          h[j] = fmaf(scan_exp2(dtv * a2), h[j], dtu * bq[j]);
        }
        float pk = cq[0] * h[0];
#pragma unroll
        for (int j = 1; j < 4; ++j) pk = fmaf(cq[j], h[j], pk);
        store_quad(srow + n0, false, nv, h);
        cur = (k & 1) ? cur + pk : pk;
        if (k == 1 && KC == 4) t01 = cur;
      }
      acc += KC == 4 ? t01 + cur : cur;
    }
#pragma unroll
    for (int o = 1; o < LANES; o <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (rv && q == 0) {
      float y = fmaf(Dd, uv, acc);
      if (FUSED) y *= silu(zv);
      out[ch] = from_f32<T>(y);
    }
  }
}

// FUSED: dt' = softplus(dt + dt_bias), B/C gathered from the x_dbl row (B at bc_offset, C right after), out = y silu(z),
// z's rows z_stride elements apart (the layer passes xz's second half in place: z_stride = 2 * d_inner).
// Plain: delta is dt' itself, B and C are [batch, d_state] rows (bc_offset 0, bc_stride d_state), no gate.
// PDL_BLOCKS: mf::pdl_enter's (a grid of at most that many blocks waits before its first load; executed in every
// block of a several-wave grid the two instructions cost 20-30%: 6.21 against 5.07 us at batch 64, 21.3 against 16.4
// at 256, the same run).
// S: the state's element (float; T itself for ssm_step_forward_fused_state16: read as f32, the new state rounded to T).
template <typename T, int LANES, int ROWS, bool FUSED, int PDL_BLOCKS = 0, typename S = float>
MF_DEVICE void ssm_step_v(T* __restrict__ out, S* __restrict__ state, const T* __restrict__ u,
                          const T* __restrict__ dt, const float* __restrict__ dt_bias, const float* __restrict__ A_log,
                          const T* __restrict__ Bm, const T* __restrict__ Cm, const float* __restrict__ Dp,
                          const T* __restrict__ z, int batch, int d_inner, int d_state, int bc_offset, int bc_stride,
                          int z_stride) {
  static_assert(LANES == 1 || LANES == 2 || LANES == 4, "LANES: 1, 2 or 4");
  static_assert(ROWS >= 1 && ROWS <= 4, "ROWS: 1..4");
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const int d = t / LANES;
  const int q = t % LANES;
  const bool dvalid = d < d_inner && d_state <= MF_STATE_CAP;
  const T* Bbase = Bm + bc_offset;
  const T* Cbase = Cm + bc_offset + (FUSED ? d_state : 0);
  // the vector path: d_state % 16 == 0 and every row's chunks aligned (uniform over the launch)
  const bool vec = (d_state & 15) == 0 && (bc_stride & 3) == 0 && aligned_quad(state) && aligned16(A_log) &&
                   aligned_quad(Bbase) && aligned_quad(Cbase);
  const int dl = min(d, d_inner - 1);  // the channel whose inputs this lane loads (clamped: always in bounds)
  const float* arow = A_log + (long long)dl * d_state;
  // launched with programmatic dependent launch on small grids (the catalog's pdl_max_blocks): no global access
  // before this point, so the index math above overlaps the grid before
  pdl_enter<PDL_BLOCKS>();
  const float bias = FUSED ? dt_bias[dl] : 0.f;
  const float Dd = Dp[dl];
  const long long row_step = (long long)gridDim.y * ROWS;  // rows past 65535 * ROWS: a grid-stride loop
  for (long long b0 = (long long)blockIdx.y * ROWS; b0 < batch; b0 += row_step) {
    if (vec)
      ssm_step_rows<T, LANES, ROWS, FUSED, true, S>(out, state, u, dt, bias, arow, Bbase, Cbase, Dd, z, (int)b0, dl,
                                                    q, dvalid, batch, d_inner, d_state, bc_stride, z_stride);
    else
      ssm_step_rows_general<T, LANES, ROWS, FUSED, S>(out, state, u, dt, bias, arow, Bbase, Cbase, Dd, z, b0, dl, q,
                                                      dvalid, batch, d_inner, d_state, bc_stride, z_stride);
  }
}

}  // namespace mf
