// Causal depthwise conv1d as in Mamba-1 (causal-conv1d): tiled forward (saving the pre-activation or not),
// tiled backward, the serial reference backward and the decode step. Catalog: kernels/fixed/conv1d.toml.
//
// Layouts: x, out, pre, dout, dx: [batch, d, L] contiguous (channel-major, as causal-conv1d); weight [d, width]
// and bias [d] in f32 (master weights); conv_state [batch, d, width-1] of the activation dtype, oldest first.
// width is a runtime argument in 1..4 (anything else: the kernel returns without writing).
//
// Per-output summation order (every kernel here, and the host walk in mamba_forge/references/conv1d.py):
//   acc = (double)bias; for k = 0..width-1: acc = acc + (double)w[k] * (double)x[t - (width-1) + k]
//   pre[t] = (float)acc                                                          (x < 0 reads as 0)
// in f64: the products of two f32 are exact, each sum is rounded once, so a serial walk reproduces the tiled
// result bit for bit whatever the tiling, and the result is within about one f32 rounding of the exact sum
// (f32 accumulation would leave ~1e-6 absolute errors where the sum cancels). Padded positions enter as
// products with 0, like the padded convolution.
#include "mf/common.cuh"
#include "mf/conv.cuh"

namespace mf {

constexpr int CONV_MAX_WIDTH = 4;
constexpr int CONV_HALO = CONV_MAX_WIDTH - 1;  // inputs before a chunk that its outputs read
constexpr int CONV_BLOCK = 128;                // threads per block of the tiled kernels
constexpr int CONV_FWD_CHUNKS = 4;             // 16-byte chunks per thread in a forward tile
// Timesteps per forward block tile: 2048 for f32, 4096 for 16-bit types, so every thread has four 16-byte loads
// in flight whatever the dtype. (At 2048 a 16-bit thread had two, half the bytes in flight of f32: bf16 reached
// 0.53 of copy bandwidth against f32's 0.89.) The catalog's grid is batch*d*ceil_div(L, 8192 // sizeof_T).
constexpr int CONV_STEP_BLOCK = 256;


// A backward channel c: its W taps widened to f64 (exact) and its f64 weight-gradient accumulators, zeroed.
template <int W>
MF_DEVICE void conv_bwd_channel_init(double (&w)[W], double (&dw)[W], const float* __restrict__ weight, i64 c) {
#pragma unroll
  for (int k = 0; k < W; ++k) w[k] = weight[c * W + k];
#pragma unroll
  for (int k = 0; k < W; ++k) dw[k] = 0.0;
}

// dpre = g * d silu(z)/dz = g * s * (1 + z * (1 - s)), s = sigmoid(z), in f64: dweight sums thousands of these
// with cancellation, so f32 rounding here would show in the result. Explicit roundings: the tiled and the
// serial backward agree bit for bit.
MF_DEVICE double conv_dpre(float g, float z) {
  const double zd = z;
  const double s = __ddiv_rn(1.0, __dadd_rn(1.0, exp(-zd)));
  return __dmul_rn((double)g, __dmul_rn(s, __dadd_rn(1.0, __dmul_rn(zd, __dsub_rn(1.0, s)))));
}

// dx[s] = sum_k w[k] * dpre[s + (W-1) - k], k ascending, in f64. dps: dpre[s .. s+W-1].
template <int W> MF_DEVICE float conv_dx(const double* w, const double* dps) {
  double acc = __dmul_rn(w[0], dps[W - 1]);
#pragma unroll
  for (int k = 1; k < W; ++k) acc = __dadd_rn(acc, __dmul_rn(w[k], dps[W - 1 - k]));
  return (float)acc;
}

template <typename T> MF_DEVICE void conv_store(T* row, const float* src, i64 s0, i64 L, bool vec) {
  constexpr int N = Vec<T>::N;
  if (vec && s0 + N <= L) {
    Vec<T> r;
#pragma unroll
    for (int j = 0; j < N; ++j) r.v[j] = from_f32<T>(src[j]);
    store_vec(row + s0, r);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (s0 + j < L) row[s0 + j] = from_f32<T>(src[j]);
  }
}

// N consecutive elements as raw T (positions >= L hold 0): 4 registers per 16-byte chunk whatever T. The
// forward holds its loads in this form; the backward keeps the next tile's chunks so while computing the current.
template <typename T> MF_DEVICE Vec<T> conv_load_raw(const T* row, i64 s0, i64 L, bool vec) {
  constexpr int N = Vec<T>::N;
  Vec<T> r;
  if (vec && s0 + N <= L) {
    r = load_vec(row + s0);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) r.v[j] = s0 + j < L ? row[s0 + j] : from_f32<T>(0.f);
  }
  return r;
}

// ---- tiled backward: one block per channel (grid-stride), walking (batch, tile of CONV_BLOCK chunks) in order;
// thread tid owns chunk tid of each tile. dx per output in the fixed conv_dx order; dweight/dbias: per-thread
// f64 partials in walk order, then mf::block_sum (a fixed order for the fixed block of CONV_BLOCK threads),
// written by thread 0. No atomics. A chunk's left x halo and right dpre halo come from its neighbours through
// shared memory; only the tile's edge chunks read them again from global memory. ----
template <typename T, int W>
MF_DEVICE void conv1d_bwd_tiled_w(T* __restrict__ dx, float* __restrict__ dweight, float* __restrict__ dbias,
                                  const T* __restrict__ x, const float* __restrict__ weight, const T* __restrict__ pre,
                                  const T* __restrict__ dout, i64 batch, i64 d, i64 L, float4* xhalo, double* dhead,
                                  double* scratch) {
  constexpr int N = Vec<T>::N;
  constexpr int TILE = CONV_BLOCK * N;
  const int tid = threadIdx.x;
  const i64 tiles = (L + TILE - 1) / TILE;
  const i64 steps = batch * tiles;  // (batch, tile) in walk order
  const bool vec = L % N == 0 && aligned16(x) && aligned16(pre) && aligned16(dout) && aligned16(dx);
  for (i64 c = blockIdx.x; c < d; c += gridDim.x) {
    double w[W], dw[W], db = 0.0;
    conv_bwd_channel_init(w, dw, weight, c);
    // software pipeline: step i+1's loads are in flight while step i computes (the walk order is unchanged)
    // (16-bit types only: for f32, ptxas spills around the f64 slow-path calls with the extra live registers)
    constexpr bool PREFETCH = sizeof(T) == 2;
    Vec<T> nx, np, ng;
    if (PREFETCH && steps > 0) {
      const i64 off = c * L, s0 = (i64)tid * N;
      nx = conv_load_raw<T>(x + off, s0, L, vec);
      np = conv_load_raw<T>(pre + off, s0, L, vec);
      ng = conv_load_raw<T>(dout + off, s0, L, vec);
    }
    for (i64 step = 0; step < steps; ++step) {
      const i64 b = step / tiles, tile = step % tiles;
      const i64 off = (b * d + c) * L;
      const T *xr = x + off, *pr = pre + off, *gr = dout + off;
      const i64 s0 = tile * TILE + (i64)tid * N;
      Vec<T> cx = nx, cp = np, cg = ng;
      if (!PREFETCH) {
        cx = conv_load_raw<T>(xr, s0, L, vec);
        cp = conv_load_raw<T>(pr, s0, L, vec);
        cg = conv_load_raw<T>(gr, s0, L, vec);
      } else if (step + 1 < steps) {
        const i64 b1 = (step + 1) / tiles, t1 = (step + 1) % tiles;
        const i64 off1 = (b1 * d + c) * L, s1 = t1 * TILE + (i64)tid * N;
        nx = conv_load_raw<T>(x + off1, s1, L, vec);
        np = conv_load_raw<T>(pre + off1, s1, L, vec);
        ng = conv_load_raw<T>(dout + off1, s1, L, vec);
      }
      {
        float xw[CONV_HALO + N];   // x[s0-3 .. s0+N-1]
        double dq[N + CONV_HALO];  // dpre[s0 .. s0+N+2]; 0 past L
#pragma unroll
        for (int j = 0; j < N; ++j) {
          xw[CONV_HALO + j] = to_f32(cx.v[j]);
          dq[j] = s0 + j < L ? conv_dpre(to_f32(cg.v[j]), to_f32(cp.v[j])) : 0.0;
        }
        __syncthreads();  // the previous tile's readers of xhalo/dhead are done
        xhalo[tid] = make_float4(xw[CONV_HALO + N - 3], xw[CONV_HALO + N - 2], xw[CONV_HALO + N - 1], 0.f);
#pragma unroll
        for (int j = 0; j < CONV_HALO; ++j) dhead[tid * CONV_HALO + j] = dq[j];
        __syncthreads();
        if (s0 >= L) continue;
        if (tid == 0) {
#pragma unroll
          for (int j = 0; j < CONV_HALO; ++j) {
            const i64 p = s0 - CONV_HALO + j;
            xw[j] = p >= 0 ? to_f32(xr[p]) : 0.f;
          }
        } else {
          const float4 h = xhalo[tid - 1];
          xw[0] = h.x, xw[1] = h.y, xw[2] = h.z;
        }
        if (tid == CONV_BLOCK - 1) {
#pragma unroll
          for (int j = 0; j < CONV_HALO; ++j) {
            const i64 p = s0 + N + j;
            dq[N + j] = p < L ? conv_dpre(to_f32(gr[p]), to_f32(pr[p])) : 0.0;
          }
        } else {
#pragma unroll
          for (int j = 0; j < CONV_HALO; ++j) dq[N + j] = dhead[(tid + 1) * CONV_HALO + j];
        }
        double xd[CONV_HALO + N];  // each input converted once
#pragma unroll
        for (int j = 0; j < CONV_HALO + N; ++j) xd[j] = xw[j];
        float gx[N];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          gx[j] = conv_dx<W>(w, &dq[j]);
          if (s0 + j < L) {
            db += dq[j];
#pragma unroll
            for (int k = 0; k < W; ++k) dw[k] += dq[j] * xd[j + CONV_MAX_WIDTH - W + k];
          }
        }
        conv_store<T>(dx + off, gx, s0, L, vec);
      }
    }
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const double s = block_sum(dw[k], scratch);
      if (tid == 0) dweight[c * W + k] = (float)s;
    }
    const double s = block_sum(db, scratch);
    if (tid == 0) dbias[c] = (float)s;
  }
}

template <typename T>
MF_DEVICE void conv1d_bwd_tiled(T* dx, float* dweight, float* dbias, const T* x, const float* weight, const T* pre,
                                const T* dout, i64 batch, i64 d, i64 L, int width) {
  __shared__ float4 xhalo[CONV_BLOCK];               // last 3 inputs of each thread's chunk
  __shared__ double dhead[CONV_BLOCK * CONV_HALO];   // first 3 dpre of each thread's chunk
  __shared__ double scratch[CONV_BLOCK / 32];
  if (blockDim.x != CONV_BLOCK) return;  // the reduction order is defined for this block size only
  switch (width) {
    case 1: conv1d_bwd_tiled_w<T, 1>(dx, dweight, dbias, x, weight, pre, dout, batch, d, L, xhalo, dhead, scratch); break;
    case 2: conv1d_bwd_tiled_w<T, 2>(dx, dweight, dbias, x, weight, pre, dout, batch, d, L, xhalo, dhead, scratch); break;
    case 3: conv1d_bwd_tiled_w<T, 3>(dx, dweight, dbias, x, weight, pre, dout, batch, d, L, xhalo, dhead, scratch); break;
    case 4: conv1d_bwd_tiled_w<T, 4>(dx, dweight, dbias, x, weight, pre, dout, batch, d, L, xhalo, dhead, scratch); break;
    default: break;
  }
}

// ---- serial reference backward: one thread per channel walks batch then time in order, keeping a window of
// the last W inputs and the next W dpre values. Slow by design (uncoalesced); it is the oracle the tiled
// backward is checked against. ----
template <typename T, int W>
MF_DEVICE void conv1d_bwd_serial_w(T* __restrict__ dx, float* __restrict__ dweight, float* __restrict__ dbias,
                                   const T* __restrict__ x, const float* __restrict__ weight, const T* __restrict__ pre,
                                   const T* __restrict__ dout, i64 batch, i64 d, i64 L) {
  for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < d; c += (i64)gridDim.x * blockDim.x) {
    double w[W], dw[W], db = 0.0;
    conv_bwd_channel_init(w, dw, weight, c);
    for (i64 b = 0; b < batch; ++b) {
      const i64 off = (b * d + c) * L;
      float xw[W];   // x[s-(W-1) .. s]
      double dq[W];  // dpre[s .. s+W-1]
#pragma unroll
      for (int k = 0; k < W; ++k) {
        xw[k] = 0.f;
        dq[k] = k < W - 1 && k < L ? conv_dpre(to_f32(dout[off + k]), to_f32(pre[off + k])) : 0.0;
      }
#pragma unroll 1
      for (i64 s = 0; s < L; ++s) {
#pragma unroll
        for (int k = 0; k + 1 < W; ++k) xw[k] = xw[k + 1];
        xw[W - 1] = to_f32(x[off + s]);
        const i64 p = s + W - 1;
        dq[W - 1] = p < L ? conv_dpre(to_f32(dout[off + p]), to_f32(pre[off + p])) : 0.0;
        dx[off + s] = from_f32<T>(conv_dx<W>(w, dq));
        db += dq[0];
#pragma unroll
        for (int k = 0; k < W; ++k) dw[k] += dq[0] * (double)xw[k];
#pragma unroll
        for (int k = 0; k + 1 < W; ++k) dq[k] = dq[k + 1];
      }
    }
#pragma unroll
    for (int k = 0; k < W; ++k) dweight[c * W + k] = (float)dw[k];
    dbias[c] = (float)db;
  }
}

template <typename T>
MF_DEVICE void conv1d_bwd_serial(T* dx, float* dweight, float* dbias, const T* x, const float* weight, const T* pre,
                                 const T* dout, i64 batch, i64 d, i64 L, int width) {
  switch (width) {
    case 1: conv1d_bwd_serial_w<T, 1>(dx, dweight, dbias, x, weight, pre, dout, batch, d, L); break;
    case 2: conv1d_bwd_serial_w<T, 2>(dx, dweight, dbias, x, weight, pre, dout, batch, d, L); break;
    case 3: conv1d_bwd_serial_w<T, 3>(dx, dweight, dbias, x, weight, pre, dout, batch, d, L); break;
    case 4: conv1d_bwd_serial_w<T, 4>(dx, dweight, dbias, x, weight, pre, dout, batch, d, L); break;
    default: break;
  }
}

// ---- decode step: one thread per (batch, channel). The window [state..., x] is summed in the forward's
// order, so stepping token by token from a zero state reproduces the tiled forward bit for bit. Then the
// state shifts left by one and takes x; out = silu(pre). ----
template <typename T, int W>
MF_DEVICE void conv1d_step_w(T* __restrict__ out, T* __restrict__ state, const T* __restrict__ x,
                             const float* __restrict__ weight, const float* __restrict__ bias, i64 batch, i64 d) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < batch * d; i += (i64)gridDim.x * blockDim.x) {
    const i64 c = i % d;
    double win[W], w[W];
#pragma unroll
    for (int k = 0; k < W; ++k) w[k] = weight[c * W + k];
    T* st = state + i * (W - 1);
#pragma unroll
    for (int k = 0; k + 1 < W; ++k) win[k] = to_f32(st[k]);
    const T xt = x[i];
    win[W - 1] = to_f32(xt);
    out[i] = from_f32<T>(silu(conv_dot<W>(w, win, (double)bias[c])));
#pragma unroll
    for (int k = 0; k + 2 < W; ++k) st[k] = st[k + 1];
    if (W > 1) st[W - 2] = xt;
  }
}

template <typename T>
MF_DEVICE void conv1d_step(T* out, T* state, const T* x, const float* weight, const float* bias, i64 batch, i64 d,
                           int width) {
  switch (width) {
    case 1: conv1d_step_w<T, 1>(out, state, x, weight, bias, batch, d); break;
    case 2: conv1d_step_w<T, 2>(out, state, x, weight, bias, batch, d); break;
    case 3: conv1d_step_w<T, 3>(out, state, x, weight, bias, batch, d); break;
    case 4: conv1d_step_w<T, 4>(out, state, x, weight, bias, batch, d); break;
    default: break;
  }
}

// ==== the forward (families conv1d_burnin_forward_tiled and _nosave_tiled) ====
// The per-output arithmetic of the contract (conv_dot in f64, silu_n), laid out for copy bandwidth; the tile
// parameters are template arguments (the layout was picked on the H200 from four candidates).

// Stores of N outputs: CS = streaming (st.global.cs, evict-first: written once, never read by this kernel).
template <typename T, bool CS> MF_DEVICE void conv_store_v(T* row, const float* src, i64 s0, i64 L, bool vec) {
  constexpr int N = Vec<T>::N;
  if (vec && s0 + N <= L) {
    Vec<T> r;
#pragma unroll
    for (int j = 0; j < N; ++j) r.v[j] = from_f32<T>(src[j]);
    if (CS) __stcs(reinterpret_cast<uint4*>(row + s0), r.raw);
    else store_vec(row + s0, r);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (s0 + j < L) row[s0 + j] = from_f32<T>(src[j]);
  }
}

// The 32-bit words of a 16-byte chunk that hold its last CONV_HALO elements (words 2..3 for 16-bit T, 1..3 for f32):
// the only ones a neighbour's halo needs, so only they are shuffled.
template <typename T> __host__ __device__ constexpr int conv_halo_word0() { return (16 - CONV_HALO * (int)sizeof(T)) / 4; }

// raw chunk of lane - 1 (its words that hold the last CONV_HALO elements); lane 0 takes `own` (its global load).
template <typename T> MF_DEVICE Vec<T> conv_halo_from_left(const Vec<T>& mine, const Vec<T>& own, int lane) {
  constexpr int W0 = conv_halo_word0<T>();
  const u32* m = reinterpret_cast<const u32*>(&mine.raw);
  const u32* o = reinterpret_cast<const u32*>(&own.raw);
  Vec<T> h;
  u32* hw = reinterpret_cast<u32*>(&h.raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (k < W0) {
      hw[k] = 0u;
    } else {
      const u32 up = __shfl_up_sync(0xffffffffu, m[k], 1);
      hw[k] = lane == 0 ? o[k] : up;
    }
  }
  return h;
}

// Forward candidate: a block walks jobs (row, tile of TILE = BLOCK*CHUNKS*N timesteps) grid-stride. Per job a
// thread owns CHUNKS 16-byte chunks: CONTIG -> one run of CHUNKS*N consecutive timesteps (chunk tid*CHUNKS + v;
// the halo of chunks 1.. is the previous chunk's tail, already in f64 registers; only chunk 0 takes a halo from
// lane - 1); else interleaved (chunk v*BLOCK + tid, coalesced per v, every chunk's halo from lane - 1). Lane 0
// loads its halo chunk (the 16 bytes before its chunk) from global memory. PIPE: the next job's loads are issued
// before this job's arithmetic (bytes stay in flight while computing; for grids smaller than the job count).
template <typename T, int W, bool SAVE, int BLOCK, int CHUNKS, bool CONTIG, bool PIPE, bool CS>
MF_DEVICE void conv1d_fwd_v_w(T* __restrict__ out, T* __restrict__ pre, const T* __restrict__ x,
                              const float* __restrict__ weight, const float* __restrict__ bias, i64 batch, i64 d,
                              i64 L) {
  typedef double A;  // the window and accumulator: the f64 contract (conv_dot)
  constexpr int N = Vec<T>::N;
  constexpr int HALOS = CONTIG ? 1 : CHUNKS;  // lane 0's global halo loads per job
  constexpr i64 TILE = (i64)BLOCK * CHUNKS * N;
  const int tid = threadIdx.x, lane = tid & 31;
  const i64 tiles = (L + TILE - 1) / TILE;
  const i64 jobs = batch * d * tiles;
  const bool vec = L % N == 0 && aligned16(x) && aligned16(out) && (!SAVE || aligned16(pre));
  auto chunk_s0 = [&](i64 t0, int v) -> i64 {
    return t0 + (CONTIG ? (i64)(tid * CHUNKS + v) : (i64)(v * BLOCK + tid)) * N;
  };
  auto issue = [&](i64 job, Vec<T>(&xv)[CHUNKS], Vec<T>(&hv)[HALOS]) {
    const i64 row = job / tiles, t0 = (job % tiles) * TILE;
    const T* xr = x + row * L;
#pragma unroll
    for (int v = 0; v < CHUNKS; ++v) xv[v] = conv_load_raw<T>(xr, chunk_s0(t0, v), L, vec);
#pragma unroll
    for (int h = 0; h < HALOS; ++h) {
      const i64 s0 = chunk_s0(t0, h);
      hv[h].raw = make_uint4(0u, 0u, 0u, 0u);  // +0 before the row, as the padded convolution
      if (lane == 0 && s0 >= N) hv[h] = conv_load_raw<T>(xr, s0 - N, L, vec);
    }
  };
  Vec<T> nx[CHUNKS], nh[HALOS];
  if (PIPE && (i64)blockIdx.x < jobs) issue(blockIdx.x, nx, nh);
  for (i64 job = blockIdx.x; job < jobs; job += gridDim.x) {
    Vec<T> cx[CHUNKS], ch[HALOS];
    if (PIPE) {
#pragma unroll
      for (int v = 0; v < CHUNKS; ++v) cx[v] = nx[v];
#pragma unroll
      for (int h = 0; h < HALOS; ++h) ch[h] = nh[h];
      if (job + gridDim.x < jobs) issue(job + gridDim.x, nx, nh);
    } else {
      issue(job, cx, ch);
    }
    const i64 row = job / tiles, t0 = (job % tiles) * TILE;
    const i64 c = row % d;
    A w[W];
#pragma unroll
    for (int k = 0; k < W; ++k) w[k] = weight[c * W + k];
    const A b = bias[c];
    A tail[CONV_HALO];  // x[s0-3 .. s0-1] of the current chunk, widened to A once
#pragma unroll
    for (int v = 0; v < CHUNKS; ++v) {
      const i64 s0 = chunk_s0(t0, v);
      if (!CONTIG || v == 0) {  // every lane shuffles (full mask) before any lane may skip its chunk
        // the chunk before this one: lane - 1's LAST chunk (CONTIG) or its chunk v (interleaved)
        const Vec<T> h = conv_halo_from_left<T>(cx[CONTIG ? CHUNKS - 1 : v], ch[CONTIG ? 0 : v], lane);
#pragma unroll
        for (int j = 0; j < CONV_HALO; ++j) tail[j] = to_f32(h.v[N - CONV_HALO + j]);
      }
      A win[CONV_HALO + N];  // x[s0-3 .. s0+N-1]
#pragma unroll
      for (int j = 0; j < CONV_HALO; ++j) win[j] = tail[j];
#pragma unroll
      for (int j = 0; j < N; ++j) win[CONV_HALO + j] = to_f32(cx[v].v[j]);
#pragma unroll
      for (int j = 0; j < CONV_HALO; ++j) tail[j] = win[N + j];
      if (s0 >= L) continue;
      float z[N], y[N];
#pragma unroll
      for (int j = 0; j < N; ++j) z[j] = conv_dot<W>(w, &win[j + CONV_MAX_WIDTH - W], b);
      silu_n<N>(y, z);
      conv_store_v<T, CS>(out + row * L, y, s0, L, vec);
      if (SAVE) conv_store_v<T, CS>(pre + row * L, z, s0, L, vec);
    }
  }
}

template <typename T, bool SAVE, int BLOCK, int CHUNKS, bool CONTIG, bool PIPE, bool CS>
MF_DEVICE void conv1d_fwd_v(T* out, T* pre, const T* x, const float* weight, const float* bias, i64 batch, i64 d,
                            i64 L, int width) {
  if (blockDim.x != BLOCK) return;  // the chunk mapping and the full-warp shuffles assume this block
  switch (width) {
    case 1: conv1d_fwd_v_w<T, 1, SAVE, BLOCK, CHUNKS, CONTIG, PIPE, CS>(out, pre, x, weight, bias, batch, d, L); break;
    case 2: conv1d_fwd_v_w<T, 2, SAVE, BLOCK, CHUNKS, CONTIG, PIPE, CS>(out, pre, x, weight, bias, batch, d, L); break;
    case 3: conv1d_fwd_v_w<T, 3, SAVE, BLOCK, CHUNKS, CONTIG, PIPE, CS>(out, pre, x, weight, bias, batch, d, L); break;
    case 4: conv1d_fwd_v_w<T, 4, SAVE, BLOCK, CHUNKS, CONTIG, PIPE, CS>(out, pre, x, weight, bias, batch, d, L); break;
    default: break;
  }
}

// The forward families' bodies (their extern "C" wrappers are generated from kernels/fixed/conv1d.toml) run the
// measured layout (benchmarks/bench_conv1d.py on the H200, 2026-12-01): 128 threads, four interleaved 16-byte
// chunks per thread per tile, the halo from lane - 1, streaming stores; the tile and grid of the kernels they
// replaced, and the same bits (the f64 contract). They forward the wrapper's parameters as they come.
template <typename T, typename... Args>
MF_DEVICE void conv1d_forward_tiled(Args... args) {  // (out, pre, x, weight, bias, batch, d, L, width)
  conv1d_fwd_v<T, true, CONV_BLOCK, CONV_FWD_CHUNKS, false, false, true>(args...);
}
template <typename T, typename... Args>
MF_DEVICE void conv1d_forward_nosave_tiled(T* out, Args... args) {  // (out, x, weight, bias, batch, d, L, width)
  conv1d_fwd_v<T, false, CONV_BLOCK, CONV_FWD_CHUNKS, false, false, true>(out, nullptr, args...);
}

}  // namespace mf
