// RMSNorm forward/backward (Mamba-1 convention: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps), weight f32).
// One 256-thread CTA per row (grid-stride over rows). Thread t owns the 8-element chunks t, t+256, ... of its
// row and accumulates them in that order; mf::block_sum folds the 256 partials in a fixed order. Nothing in a
// row's arithmetic depends on the number of rows or on which CTA runs it: batch invariant by construction.
// The weight gradient is not reduced here: each row writes its own contribution dy*x*rstd to a [rows, dim]
// f32 scratch, which reduce_sum_axis0 (elementwise.cu) folds over rows in a fixed order. No atomics.
// Each symbol's extern "C" wrapper is written by the catalog from kernels/fixed/norm.toml (params, bounds) and calls
// the body its family names: rmsnorm_forward<TX, TY> (the f32in variants: TX = f32), rmsnorm_forward_resadd<T>,
// rmsnorm_backward<TX, TG, TDX>.
#include "mf/common.cuh"
#include "mf/elementwise.cuh"

namespace mf {

constexpr int NORM_BLOCK = 256;
constexpr int NORM_W = 8;
constexpr i64 NORM_SPAN = (i64)NORM_BLOCK * NORM_W;  // elements between a thread's consecutive chunks of a row
// A thread takes its chunks NORM_C at a time and issues all their loads before the first use (load_whole), so
// several 16-byte loads per array are in flight; a loop that consumes each chunk before loading the next waits
// on memory once per chunk. Partials still accumulate chunk by chunk in row order: the same sums as before.
constexpr int NORM_C = 2;

// Rows are vector-loaded only when every row start stays 16-byte aligned: base aligned and dim % 8 == 0.
MF_DEVICE bool rows_vec(const void* p, i64 dim) { return aligned16(p) && dim % NORM_W == 0; }

// ss += v^2 over a group of a row, chunk by chunk in row order; chunks past the row add nothing.
MF_DEVICE void add_squares(float& ss, const float (&v)[NORM_C][NORM_W], i64 i0, i64 dim) {
#pragma unroll
  for (int c = 0; c < NORM_C; ++c)
    if (i0 + c * NORM_SPAN < dim)
#pragma unroll
      for (int k = 0; k < NORM_W; ++k) ss += v[c][k] * v[c][k];
}

// The normalising pass of a row: yr[j] = (src[j] * r) * w[j], src being the row the sum of squares was taken over.
template <typename TS, typename TY>
MF_DEVICE void rms_scale_row(TY* __restrict__ yr, bool vy, const TS* __restrict__ src, bool vs,
                             const float* __restrict__ w, bool vw, float r, i64 dim) {
  for (i64 i0 = (i64)threadIdx.x * NORM_W; i0 < dim; i0 += NORM_C * NORM_SPAN) {
    float v[NORM_C][NORM_W], g[NORM_C][NORM_W];
    load_group<NORM_C, NORM_W>(i0, NORM_SPAN, dim, vs && vw, v, src, vs, g, w, vw);
#pragma unroll
    for (int c = 0; c < NORM_C; ++c)
#pragma unroll
      for (int k = 0; k < NORM_W; ++k) v[c][k] = (v[c][k] * r) * g[c][k];
    store_each(yr, v, i0, NORM_SPAN, dim, vy);
  }
}

// y[r,:] = x[r,:] * rstd[r] * w, rstd[r] = 1/sqrt(sum(x[r,:]^2)/dim + eps). TX: input, TY: output.
template <typename TX, typename TY>
MF_DEVICE void rmsnorm_forward(TY* __restrict__ y, float* __restrict__ rstd, const TX* __restrict__ x,
                               const float* __restrict__ w, i64 rows, i64 dim, float eps) {
  __shared__ float scratch[NORM_BLOCK / 32];
  const bool vx = rows_vec(x, dim), vy = rows_vec(y, dim), vw = rows_vec(w, dim);
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const TX* xr = x + row * dim;
    TY* yr = y + row * dim;
    float ss = 0.f;
    for (i64 i0 = (i64)threadIdx.x * NORM_W; i0 < dim; i0 += NORM_C * NORM_SPAN) {
      float v[NORM_C][NORM_W];
      load_group<NORM_C, NORM_W>(i0, NORM_SPAN, dim, vx, v, xr, vx);
      add_squares(ss, v, i0, dim);
    }
    ss = block_sum(ss, scratch);
    const float r = rsqrtf(ss / (float)dim + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    rms_scale_row(yr, vy, xr, vx, w, vw, r, dim);  // second read of the row: served by L2, not HBM
  }
}

// Fused residual add (residual stream in f32): residual[r,:] += x[r,:], then y = rmsnorm(residual) as above.
// PDL_BLOCKS: mf::pdl_enter's (a Block's decode launches it behind the previous layer's out_proj GEMM).
template <typename T, int PDL_BLOCKS = 0>
MF_DEVICE void rmsnorm_forward_resadd(T* __restrict__ y, float* __restrict__ rstd, float* __restrict__ residual,
                                      const T* __restrict__ x, const float* __restrict__ w, i64 rows, i64 dim,
                                      float eps) {
  __shared__ float scratch[NORM_BLOCK / 32];
  pdl_enter<PDL_BLOCKS>();
  const bool vx = rows_vec(x, dim), vy = rows_vec(y, dim), vw = rows_vec(w, dim), vr = rows_vec(residual, dim);
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * dim;
    float* rr = residual + row * dim;
    T* yr = y + row * dim;
    float ss = 0.f;
    if (dim <= NORM_C * NORM_SPAN) {
      // The row is one group a thread (d_model up to 4096): its sums stay in registers for the normalising pass,
      // and the weight's loads go out with the row's, so a decode's one-row launch waits on memory once, not three
      // times (re-reading the residual it just wrote, then w). Same sums in the same order, so the same bits.
      const i64 i0 = (i64)threadIdx.x * NORM_W;
      float h[NORM_C][NORM_W], v[NORM_C][NORM_W], g[NORM_C][NORM_W];
      if (i0 < dim) {
        load_group<NORM_C, NORM_W>(i0, NORM_SPAN, dim, vr && vx, h, rr, vr, v, xr, vx);
        load_group<NORM_C, NORM_W>(i0, NORM_SPAN, dim, vw, g, w, vw);
        apply<OpAdd>(h, v);
        add_squares(ss, h, i0, dim);
        store_each(rr, h, i0, NORM_SPAN, dim, vr);  // writes nothing past the row
      }
      ss = block_sum(ss, scratch);
      const float r = rsqrtf(ss / (float)dim + eps);
      if (threadIdx.x == 0) rstd[row] = r;
      if (i0 < dim) {
#pragma unroll
        for (int c = 0; c < NORM_C; ++c)
#pragma unroll
          for (int k = 0; k < NORM_W; ++k) h[c][k] = (h[c][k] * r) * g[c][k];
        store_each(yr, h, i0, NORM_SPAN, dim, vy);
      }
      continue;
    }
    for (i64 i0 = (i64)threadIdx.x * NORM_W; i0 < dim; i0 += NORM_C * NORM_SPAN) {
      float h[NORM_C][NORM_W], v[NORM_C][NORM_W];
      load_group<NORM_C, NORM_W>(i0, NORM_SPAN, dim, vr && vx, h, rr, vr, v, xr, vx);
      apply<OpAdd>(h, v);
      add_squares(ss, h, i0, dim);
      store_each(rr, h, i0, NORM_SPAN, dim, vr);  // writes nothing past the row
    }
    ss = block_sum(ss, scratch);
    const float r = rsqrtf(ss / (float)dim + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    // Each thread re-reads exactly the chunks it wrote above (same i0, span and path), so no barrier is needed.
    rms_scale_row(yr, vy, rr, vr, w, vw, r, dim);
  }
}

// The backward's three row arrays (x, dy, w) at i0 as one load group. Written out rather than through the variadic
// load_group: with three arrays that form changed the code ptxas generates for sm_100a and sm_120a.
template <typename TX, typename TG>
MF_DEVICE void load_bwd_group(float (&v)[NORM_C][NORM_W], float (&g)[NORM_C][NORM_W], float (&ww)[NORM_C][NORM_W],
                              const TX* __restrict__ xr, bool vx, const TG* __restrict__ gr, bool vdy,
                              const float* __restrict__ w, bool vw, i64 i0, i64 dim) {
  if (group_whole<NORM_C, NORM_W>(vx && vdy && vw, i0, NORM_SPAN, dim)) {
    load_whole(v, xr, i0, NORM_SPAN);
    load_whole(g, gr, i0, NORM_SPAN);
    load_whole(ww, w, i0, NORM_SPAN);
  } else {
    load_each(v, xr, i0, NORM_SPAN, dim, vx);
    load_each(g, gr, i0, NORM_SPAN, dim, vdy);
    load_each(ww, w, i0, NORM_SPAN, dim, vw);
  }
}

// Backward with the forward's saved rstd r (per row):
//   s = sum_j dy_j * w_j * x_j;  dx_j = r * w_j * dy_j - x_j * (r^3 * s / dim);  dw_rows[r, j] = dy_j * x_j * r.
// TX: the forward's input, TG: dy, TDX: dx (f32 when the input was the f32 residual stream).
template <typename TX, typename TG, typename TDX>
MF_DEVICE void rmsnorm_backward(TDX* __restrict__ dx, float* __restrict__ dw_rows, const TG* __restrict__ dy,
                                const TX* __restrict__ x, const float* __restrict__ w, const float* __restrict__ rstd,
                                i64 rows, i64 dim) {
  __shared__ float scratch[NORM_BLOCK / 32];
  const bool vdx = rows_vec(dx, dim), vdw = rows_vec(dw_rows, dim), vdy = rows_vec(dy, dim), vx = rows_vec(x, dim),
             vw = rows_vec(w, dim);
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const TX* xr = x + row * dim;
    const TG* gr = dy + row * dim;
    float s = 0.f;
    for (i64 i0 = (i64)threadIdx.x * NORM_W; i0 < dim; i0 += NORM_C * NORM_SPAN) {
      float v[NORM_C][NORM_W], g[NORM_C][NORM_W], ww[NORM_C][NORM_W];
      load_bwd_group(v, g, ww, xr, vx, gr, vdy, w, vw, i0, dim);
#pragma unroll
      for (int c = 0; c < NORM_C; ++c)
        if (i0 + c * NORM_SPAN < dim)  // chunks past the row add nothing
#pragma unroll
          for (int k = 0; k < NORM_W; ++k) s += (g[c][k] * ww[c][k]) * v[c][k];
    }
    s = block_sum(s, scratch);
    const float r = rstd[row];
    const float coef = ((r * r) * r) * (s / (float)dim);
    for (i64 i0 = (i64)threadIdx.x * NORM_W; i0 < dim; i0 += NORM_C * NORM_SPAN) {
      float v[NORM_C][NORM_W], g[NORM_C][NORM_W], ww[NORM_C][NORM_W];
      load_bwd_group(v, g, ww, xr, vx, gr, vdy, w, vw, i0, dim);
      float d[NORM_C][NORM_W], pw[NORM_C][NORM_W];
#pragma unroll
      for (int c = 0; c < NORM_C; ++c)
#pragma unroll
        for (int k = 0; k < NORM_W; ++k) {
          d[c][k] = __fsub_rn(__fmul_rn(r, __fmul_rn(ww[c][k], g[c][k])), __fmul_rn(v[c][k], coef));
          pw[c][k] = (g[c][k] * v[c][k]) * r;
        }
      store_each(dx + row * dim, d, i0, NORM_SPAN, dim, vdx);
      store_each(dw_rows + row * dim, pw, i0, NORM_SPAN, dim, vdw);
    }
  }
}

}  // namespace mf
