// Elementwise, gather/scatter and column-reduction kernels of the Mamba-1 block. Contracts live in
// kernels/fixed/elementwise.toml, whose params and bounds give each symbol's extern "C" wrapper (written by the
// catalog: mamba_forge/catalog/wrappers.py), calling the body its family names here or in mf/elementwise.cuh. Everything computes in f32 and is deterministic by construction: every output
// element is written by exactly one thread, and the column sums fold rows in one fixed order (no atomics).
// Flat maps (map1, map2, map2_inplace: mf/elementwise.cuh) use 8-element chunks (16-byte vectors when aligned,
// scalar tail), 2-4 chunks per thread per tile so several loads are in flight; W = 1 marks the plain scalar forms
// (symbols without _v where a _v sibling exists).
#include "mf/common.cuh"
#include "mf/elementwise.cuh"

namespace mf {

// ---- pointwise operations ----
struct OpMul { static MF_DEVICE float f(float a, float b) { return a * b; } };
struct OpGateSilu { static MF_DEVICE float f(float y, float z) { return y * silu(z); } };  // Mamba: y * silu(z)
struct OpIdentity { static MF_DEVICE float f(float a) { return a; } };
struct OpExpNegate { static MF_DEVICE float f(float a) { return -expf(a); } };  // A = -exp(A_log)

constexpr float LOG2E = 1.4426950408889634f;

// Backward of out = y * silu(z): dy = dout * silu(z); dz = dout * y * sigmoid(z) * (1 + z * (1 - sigmoid(z))).
template <typename T>
MF_DEVICE void gating_backward(T* __restrict__ dy, T* __restrict__ dz, const T* __restrict__ dout,
                               const T* __restrict__ y, const T* __restrict__ z, i64 n) {
  constexpr int W = 8;
  const bool vec = aligned16(dy) && aligned16(dz) && aligned16(dout) && aligned16(y) && aligned16(z);
  for (i64 i0 = global_thread() * W; i0 < n; i0 += grid_threads() * W) {
    float g[W], a[W], c[W], ga[W], gc[W];
    load_chunk<W>(g, dout, i0, n, vec);
    load_chunk<W>(a, y, i0, n, vec);
    load_chunk<W>(c, z, i0, n, vec);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float s = sigmoid(c[k]);
      ga[k] = g[k] * (c[k] * s);
      gc[k] = (g[k] * a[k]) * (s * (1.f + c[k] * (1.f - s)));
    }
    store_chunk<W>(dy, ga, i0, n, vec);
    store_chunk<W>(dz, gc, i0, n, vec);
  }
}

// A[i] = -exp(A_log[i]) and A_log2e[i] = A[i] * log2(e) (the scan's exp2-domain copy), in one pass.
MF_DEVICE void exp_negate2(float* __restrict__ A, float* __restrict__ A_log2e, const float* __restrict__ A_log, i64 n) {
  constexpr int W = 8;
  const bool vec = aligned16(A) && aligned16(A_log2e) && aligned16(A_log);
  for (i64 i0 = global_thread() * W; i0 < n; i0 += grid_threads() * W) {
    float u[W], v[W];
    load_chunk<W>(u, A_log, i0, n, vec);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      u[k] = -expf(u[k]);
      v[k] = u[k] * LOG2E;
    }
    store_chunk<W>(A, u, i0, n, vec);
    store_chunk<W>(A_log2e, v, i0, n, vec);
  }
}

// y[r,c] += bias[c] in place, y [rows, cols] row-major, bias f32 [cols].
template <typename T> MF_DEVICE void bias_broadcast(T* __restrict__ y, const float* __restrict__ bias, i64 rows, i64 cols) {
  constexpr int W = 8;
  const i64 n = rows * cols;
  const bool vec = aligned16(y);
  const bool vec_bias = vec && aligned16(bias) && cols % W == 0;  // then a chunk never crosses a row
  for (i64 i0 = global_thread() * W; i0 < n; i0 += grid_threads() * W) {
    float u[W], b[W];
    load_chunk<W>(u, y, i0, n, vec);
    const i64 c0 = i0 % cols;
    if (vec_bias) {
      load_chunk<W>(b, bias, c0, cols, true);
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) b[k] = i0 + k < n ? bias[(c0 + k) % cols] : 0.f;
    }
#pragma unroll
    for (int k = 0; k < W; ++k) u[k] = u[k] + b[k];
    store_chunk<W>(y, u, i0, n, vec);
  }
}

// ---- fixed-order column sums: out[c] (=|+=) sum_r in[r, c] ----
// A 256-thread CTA owns 32 columns: thread (lane, g) sums rows g, g+8, g+16, ... of column lane in row order,
// then lane's 8 group partials are added in group order 0..7. The order depends only on rows: deterministic.
constexpr int COLSUM_COLS = 32, COLSUM_GROUPS = 8;
template <typename TIn, bool ACCUMULATE>
MF_DEVICE void colsum(float* __restrict__ out, const TIn* __restrict__ in, i64 rows, i64 cols) {
  __shared__ float part[COLSUM_GROUPS][COLSUM_COLS];
  if (blockDim.x != COLSUM_COLS * COLSUM_GROUPS) return;  // the order is defined for this shape only
  const int lane = threadIdx.x % COLSUM_COLS, g = threadIdx.x / COLSUM_COLS;
  for (i64 cb = (i64)blockIdx.x * COLSUM_COLS; cb < cols; cb += (i64)gridDim.x * COLSUM_COLS) {
    const i64 c = cb + lane;
    float acc = 0.f;
    if (c < cols)
      for (i64 r = g; r < rows; r += COLSUM_GROUPS) acc += to_f32(in[r * cols + c]);
    part[g][lane] = acc;
    __syncthreads();
    if (g == 0 && c < cols) {
      float s = part[0][lane];
#pragma unroll
      for (int k = 1; k < COLSUM_GROUPS; ++k) s += part[k][lane];
      out[c] = ACCUMULATE ? out[c] + s : s;
    }
    __syncthreads();  // part is reused by the next column block
  }
}

// ---- gathers, scatters, packing: integer index maps, exact copies ----
// out[r, j] = in[r, col0 + j]; out [rows, ncols], in [rows, ld].
template <typename T>
MF_DEVICE void gather_cols(T* __restrict__ out, const T* __restrict__ in, i64 rows, i64 ncols, i64 ld, i64 col0) {
  const i64 n = rows * ncols;
  for (i64 i = global_thread(); i < n; i += grid_threads()) {
    const i64 r = i / ncols, j = i - r * ncols;
    out[i] = in[r * ld + col0 + j];
  }
}

// dst[r, col0 + j] += src[r, j]; dst [rows, ld], src [rows, ncols]. One thread per destination element.
template <typename T>
MF_DEVICE void scatter_add_cols(T* __restrict__ dst, const T* __restrict__ src, i64 rows, i64 ncols, i64 ld, i64 col0) {
  const i64 n = rows * ncols;
  for (i64 i = global_thread(); i < n; i += grid_threads()) {
    const i64 r = i / ncols, j = i - r * ncols;
    T* d = dst + r * ld + col0 + j;
    *d = from_f32<T>(to_f32(*d) + to_f32(src[i]));
  }
}

// x_dbl rows are [dt (dt_rank) | B (d_state) | C (d_state)], row r = b * seqlen + t.
// Row-major: B[r, s] = x_dbl[r, dt_rank + s], C[r, s] = x_dbl[r, dt_rank + d_state + s]; B, C [rows, d_state].
template <typename T>
MF_DEVICE void gather_bc_cols(T* __restrict__ B, T* __restrict__ C, const T* __restrict__ x_dbl, i64 batch,
                              i64 seqlen, i64 dt_rank, i64 d_state) {
  const i64 ld = dt_rank + 2 * d_state, n = batch * seqlen * d_state;
  for (i64 i = global_thread(); i < n; i += grid_threads()) {
    const i64 r = i / d_state, s = i - r * d_state;
    B[i] = x_dbl[r * ld + dt_rank + s];
    C[i] = x_dbl[r * ld + dt_rank + d_state + s];
  }
}

// Time-major (the scan's layout): B[b, s, t] = x_dbl[b*seqlen + t, dt_rank + s], C likewise; [batch, d_state, seqlen].
template <typename T>
MF_DEVICE void gather_bc_cols_tmajor(T* __restrict__ B, T* __restrict__ C, const T* __restrict__ x_dbl, i64 batch,
                                     i64 seqlen, i64 dt_rank, i64 d_state) {
  const i64 ld = dt_rank + 2 * d_state, n = batch * seqlen * d_state;
  for (i64 i = global_thread(); i < n; i += grid_threads()) {
    const i64 t = i % seqlen, bs = i / seqlen, s = bs % d_state, b = bs / d_state;
    const i64 src = (b * seqlen + t) * ld + dt_rank + s;
    B[i] = x_dbl[src];
    C[i] = x_dbl[src + d_state];
  }
}

// Same result as gather_bc_cols_tmajor through a 32x32 shared-memory transpose, so both the reads (along s)
// and the writes (along t) are coalesced. Grid: (ceil(seqlen/32), ceil(d_state/32), batch), 256 threads.
constexpr int TILE = 32;
template <typename T>
MF_DEVICE void gather_bc_cols_tmajor_tiled(T* __restrict__ B, T* __restrict__ C, const T* __restrict__ x_dbl,
                                           i64 batch, i64 seqlen, i64 dt_rank, i64 d_state) {
  __shared__ float tile[TILE][TILE + 1];  // f32 holds any T exactly; +1 avoids bank conflicts on the transpose
  const i64 ld = dt_rank + 2 * d_state;
  const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE, rows_per_pass = blockDim.x / TILE;
  const i64 t0 = (i64)blockIdx.x * TILE, s0 = (i64)blockIdx.y * TILE, b = blockIdx.z;
  if (b >= batch) return;
  for (int m = 0; m < 2; ++m) {
    T* dst = m == 0 ? B : C;
    const i64 col = dt_rank + m * d_state;
    for (int k = ty; k < TILE; k += rows_per_pass) {
      const i64 t = t0 + k, s = s0 + tx;
      if (t < seqlen && s < d_state) tile[k][tx] = to_f32(x_dbl[(b * seqlen + t) * ld + col + s]);
    }
    __syncthreads();
    for (int k = ty; k < TILE; k += rows_per_pass) {
      const i64 s = s0 + k, t = t0 + tx;
      if (s < d_state && t < seqlen) dst[(b * d_state + s) * seqlen + t] = from_f32<T>(tile[tx][k]);
    }
    __syncthreads();
  }
}

// out[b, c, r] = src[b, r, c]: batch of [rows, cols] matrices (rows ld_in elements apart, batch rows * ld_in) into
// [cols, rows] ones (ld_out apart, batch cols * ld_out), so a column slice (z = xz[..., d:]) is read and a half of
// wider rows written in place. Why ours and not torch's copy: the layer's backward changes between token-major
// [b, L, c] and channel-major [b, c, L] a dozen times a step, and torch's strided copy of 16-bit elements moves them
// at about a quarter of the bandwidth (profile: 2.7 ms of a 7.6 ms training step). 64x64 tiles through shared
// memory, raw bits (a pure copy: NaN payloads kept). Grid (ceil(cols/64), ceil(rows/64), batch), 256 threads.
// Whole tiles move in 32-bit words (two 16-bit elements a word where rows and pointers allow), every load of a
// thread issued before its first shared-memory store so 8-16 are in flight (one at a time, a runtime-strided loop
// moved ~1.3 TB/s); edge tiles and odd strides take the per-element path.
constexpr int TT = 64, TT_THREADS = 256;
template <int S> struct TransposeBits;
template <> struct TransposeBits<2> { using type = unsigned short; };
template <> struct TransposeBits<4> { using type = unsigned; };

template <typename T>
MF_DEVICE void transpose_rows(T* __restrict__ out, const T* __restrict__ src_all, i64 batch, i64 rows, i64 cols,
                              i64 ld_in, i64 ld_out) {
  using Bits = typename TransposeBits<sizeof(T)>::type;
  constexpr int P = 4 / (int)sizeof(T);  // elements a 32-bit word
  // 16-bit: 66 elements (33 words) a row keep word pairs aligned and the column reads at most 2-way conflicted;
  // 32-bit: 65 words, conflict-free
  constexpr int PITCH = P == 2 ? TT + 2 : TT + 1;
  __shared__ __align__(4) Bits tile[TT][PITCH];
  const i64 c0 = (i64)blockIdx.x * TT, r0 = (i64)blockIdx.y * TT, b = blockIdx.z;
  if (b >= batch) return;
  const Bits* src = reinterpret_cast<const Bits*>(src_all) + b * rows * ld_in;
  Bits* dst = reinterpret_cast<Bits*>(out) + b * cols * ld_out;
  const bool whole = r0 + TT <= rows && c0 + TT <= cols;
  const bool words = P == 1 || ((((ld_in | ld_out) & 1) == 0) && (reinterpret_cast<u64>(src) & 3) == 0 &&
                                (reinterpret_cast<u64>(dst) & 3) == 0);
  if (whole && words) {
    constexpr int PER_ROW = TT / P, ROWS_PER = TT_THREADS / PER_ROW, PASSES = TT / ROWS_PER;
    const int tx = threadIdx.x % PER_ROW, ty = threadIdx.x / PER_ROW;
    u32 v[PASSES];
#pragma unroll
    for (int k = 0; k < PASSES; ++k)
      v[k] = reinterpret_cast<const u32*>(src + (r0 + ty + k * ROWS_PER) * ld_in + c0)[tx];
#pragma unroll
    for (int k = 0; k < PASSES; ++k) reinterpret_cast<u32*>(&tile[ty + k * ROWS_PER][0])[tx] = v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < PASSES; ++k) {
      const int c = ty + k * ROWS_PER;  // the source column this pass writes as an output row
      u32 w;
      if constexpr (P == 2) w = (u32)tile[2 * tx][c] | ((u32)tile[2 * tx + 1][c] << 16);
      else w = tile[tx][c];
      reinterpret_cast<u32*>(dst + (c0 + c) * ld_out + r0)[tx] = w;
    }
    return;
  }
  constexpr int STEP = TT_THREADS / TT;
  const int tx = threadIdx.x % TT, ty = threadIdx.x / TT;
#pragma unroll
  for (int k = ty; k < TT; k += STEP) {
    const i64 r = r0 + k, c = c0 + tx;
    if (r < rows && c < cols) tile[k][tx] = src[r * ld_in + c];
  }
  __syncthreads();
#pragma unroll
  for (int k = ty; k < TT; k += STEP) {
    const i64 c = c0 + k, r = r0 + tx;
    if (c < cols && r < rows) dst[c * ld_out + r] = tile[tx][k];
  }
}

// out[b, d] = in[b, seqlen - 1, d]; in [batch, seqlen, dim], out [batch, dim].
template <typename T>
MF_DEVICE void gather_last_timestep(T* __restrict__ out, const T* __restrict__ in, i64 batch, i64 seqlen, i64 dim) {
  const i64 n = batch * dim;
  for (i64 i = global_thread(); i < n; i += grid_threads()) {
    const i64 b = i / dim, d = i - b * dim;
    out[i] = in[(b * seqlen + seqlen - 1) * dim + d];
  }
}

// out[r, 0:dim] = a[r, :], out[r, dim:2dim] = b[r, :]; out [rows, 2*dim].
template <typename T>
MF_DEVICE void concat_halves(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, i64 rows, i64 dim) {
  const i64 n = rows * 2 * dim;
  for (i64 i = global_thread(); i < n; i += grid_threads()) {
    const i64 r = i / (2 * dim), c = i - r * 2 * dim;
    out[i] = c < dim ? a[r * dim + c] : b[r * dim + c - dim];
  }
}

// x_dbl[r, :] = [dt[r, :] | B[r, :] | C[r, :]]; dt [rows, dt_rank], B, C [rows, d_state] row-major.
template <typename T>
MF_DEVICE void pack_xdbl_cols(T* __restrict__ x_dbl, const T* __restrict__ dt, const T* __restrict__ B,
                              const T* __restrict__ C, i64 rows, i64 dt_rank, i64 d_state) {
  const i64 ld = dt_rank + 2 * d_state, n = rows * ld;
  for (i64 i = global_thread(); i < n; i += grid_threads()) {
    const i64 r = i / ld, c = i - r * ld;
    x_dbl[i] = c < dt_rank ? dt[r * dt_rank + c]
             : c < dt_rank + d_state ? B[r * d_state + c - dt_rank]
                                     : C[r * d_state + c - dt_rank - d_state];
  }
}

}  // namespace mf
