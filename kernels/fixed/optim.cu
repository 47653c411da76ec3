// Training-step kernels: inf/nan detection, loss-scale (un)scaling, deterministic gradient-norm clipping and
// AdamW (plain, graph-capturable, multi-tensor). Catalog: kernels/fixed/optim.toml; references:
// mamba_forge/references/optim.py.
//
// Determinism: no floating-point atomics anywhere. The norm is a fixed grid of GRAD_PARTIALS (512, the reference
// library's contract) virtual blocks, each summing a fixed set of elements in a fixed order in f64 (whatever grid
// is actually launched), then one thread folds the partials in ascending order. The only atomic is the integer arrival counter of the capturable
// AdamW, whose result (the step count) does not depend on arrival order.
#include "mf/common.cuh"
#include "mf/elementwise.cuh"

namespace mf {

constexpr int GRAD_PARTIALS = 512;  // partial sums of squares: fixed by the contract, not by n or the device
constexpr int GRAD_BLOCK = 256;      // threads per (virtual) block of the partial-sum kernels
constexpr int OPT_BLOCK = 256;

MF_DEVICE bool nonfinite(float v) { return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u; }

// Chunks of 4 f32: chunk c covers elements [4c, 4c+4) of [0, n). `vec`: base is 16-byte aligned, so a whole
// chunk is one float4; the tail chunk (and unaligned bases) go element by element, same values.
MF_DEVICE void load4(float* dst, const float* base, i64 c, i64 n, bool vec) {
  const i64 i = 4 * c;
  if (vec && i + 4 <= n) {
    const float4 r = *reinterpret_cast<const float4*>(base + i);
    dst[0] = r.x, dst[1] = r.y, dst[2] = r.z, dst[3] = r.w;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) dst[j] = i + j < n ? base[i + j] : 0.f;
  }
}
MF_DEVICE void store4(float* base, const float* src, i64 c, i64 n, bool vec) {
  const i64 i = 4 * c;
  if (vec && i + 4 <= n) {
    *reinterpret_cast<float4*>(base + i) = make_float4(src[0], src[1], src[2], src[3]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (i + j < n) base[i + j] = src[j];
  }
}

// ---- inf/nan detection: any non-finite element stores 1 to *found (a plain store; *found is never cleared
// here, so the caller zeroes it once per step and several checks may share it) ----
MF_DEVICE void check_inf_nan(const float* __restrict__ x, i64 n, int* __restrict__ found) {
  const i64 chunks = (n + 3) / 4, stride = (i64)gridDim.x * blockDim.x;
  const bool vec = aligned16(x);
  bool bad = false;
  for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    float v[4];
    load4(v, x, c, n, vec);
    bad |= nonfinite(v[0]) | nonfinite(v[1]) | nonfinite(v[2]) | nonfinite(v[3]);
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *found = 1;
}

// ---- g[i] *= scale over [0, n) ----
MF_DEVICE void scale_span(float* __restrict__ g, i64 n, float scale) {
  const i64 chunks = (n + 3) / 4, stride = (i64)gridDim.x * blockDim.x;
  const bool vec = aligned16(g);
  for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    float v[4];
    load4(v, g, c, n, vec);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = v[j] * scale;
    store4(g, v, c, n, vec);
  }
}

// ---- sums of squares. Virtual block p in [0, GRAD_PARTIALS) owns chunks c = k*GRAD_PARTIALS*GRAD_BLOCK +
// p*GRAD_BLOCK + tid (k ascending) of each span; a thread adds its elements' squares in f64 (exact products)
// in that order, then mf::block_sum folds the threads in a fixed order. ----
MF_DEVICE void sumsq_span(double& acc, const float* __restrict__ g, i64 n, int p) {
  const bool vec = aligned16(g);
  const i64 chunks = (n + 3) / 4;
  for (i64 c = (i64)p * GRAD_BLOCK + threadIdx.x; c < chunks; c += (i64)GRAD_PARTIALS * GRAD_BLOCK) {
    float v[4];
    load4(v, g, c, n, vec);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc += (double)v[j] * (double)v[j];
  }
}

// Span r is [offsets[r], offsets[r] + lengths[r]) clamped to [0, n).
MF_DEVICE bool span_bounds(i64& base, i64& len, const i64* offsets, const i64* lengths, int r, i64 n) {
  i64 lo = offsets[r], hi = lo + lengths[r];
  lo = lo < 0 ? 0 : (lo > n ? n : lo);
  hi = hi < lo ? lo : (hi > n ? n : hi);
  base = lo, len = hi - lo;
  return len > 0;
}

// The fixed grid: virtual blocks p = blockIdx.x, blockIdx.x + gridDim.x, ... each run accumulate(acc, p) per
// thread, then a fixed-order block sum; partials[p] is a plain store (no precondition on its contents).
template <typename Accumulate> MF_DEVICE void sumsq_partials(double* __restrict__ partials, Accumulate accumulate) {
  __shared__ double scratch[GRAD_BLOCK / 32];
  if (blockDim.x != GRAD_BLOCK) return;  // the order is defined for this block size only
  for (int p = blockIdx.x; p < GRAD_PARTIALS; p += gridDim.x) {
    double acc = 0.0;
    accumulate(acc, p);
    const double total = block_sum(acc, scratch);
    if (threadIdx.x == 0) partials[p] = total;
  }
}

// ---- the per-layer region of the flat gradient arena (the reference library's two-block region): a strided
// column stripe, rows x cols elements at stripe_off + r*ld + c, then a contiguous vector [vec_off, vec_off +
// vec_len). Its elements are numbered v = r*cols + c over the stripe, then rows*cols + i over the vector; chunk
// c holds v in [4c, 4c + 4) and is dealt like the flat arena's chunk c. Elements whose address is outside
// [0, n) count as absent (0 in a sum, never written). ----
struct GradRegion {
  i64 stripe_off, ld, vec_off, vec_len, stripe_n, total;
  int cols;

  MF_DEVICE GradRegion(i64 stripe_off_, int rows, int cols_, i64 ld_, i64 vec_off_, i64 vec_len_)
      : stripe_off(stripe_off_), ld(ld_), vec_off(vec_off_), cols(cols_) {
    rows = rows > 0 ? rows : 0;
    cols = cols > 0 ? cols : 0;
    vec_len = vec_len_ > 0 ? vec_len_ : 0;
    stripe_n = (i64)rows * cols;
    total = stripe_n + vec_len;
  }
  // address of element v < total; `run`: how many elements from v on are contiguous in memory
  MF_DEVICE i64 addr(i64 v, i64& run) const {
    if (v >= stripe_n) {
      run = total - v;
      return vec_off + (v - stripe_n);
    }
    // 32-bit division when the stripe is under 2^32 elements (always, for a weight matrix's stripe)
    i64 r, c;
    if (stripe_n <= 0xffffffffll) {
      const u32 q = (u32)v / (u32)cols;
      r = q, c = (u32)v - q * (u32)cols;
    } else {
      r = v / cols, c = v % cols;
    }
    run = cols - c;
    return stripe_off + r * ld + c;
  }
  // the 4 elements of chunk k (0 where absent); one float4 when they are contiguous, inside [0, n) and
  // 16-byte aligned, else element by element: the same values either way
  MF_DEVICE void load(float* dst, const float* g, i64 n, i64 k) const {
    const i64 v = 4 * k;
    i64 run;
    const i64 a = addr(v, run);
    if (run >= 4 && a >= 0 && a + 4 <= n && aligned16(g + a)) {
      const float4 q = *reinterpret_cast<const float4*>(g + a);
      dst[0] = q.x, dst[1] = q.y, dst[2] = q.z, dst[3] = q.w;
      return;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      i64 unused;
      const i64 e = v + j < total ? addr(v + j, unused) : -1;
      dst[j] = e >= 0 && e < n ? g[e] : 0.f;
    }
  }
  MF_DEVICE void scale(float* g, i64 n, i64 k, float coef) const {
    const i64 v = 4 * k;
    i64 run;
    const i64 a = addr(v, run);
    if (run >= 4 && a >= 0 && a + 4 <= n && aligned16(g + a)) {
      float4 q = *reinterpret_cast<const float4*>(g + a);
      q.x *= coef, q.y *= coef, q.z *= coef, q.w *= coef;
      *reinterpret_cast<float4*>(g + a) = q;
      return;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      i64 unused;
      const i64 e = v + j < total ? addr(v + j, unused) : -1;
      if (e >= 0 && e < n) g[e] = g[e] * coef;
    }
  }
};

MF_DEVICE void region_sumsq(double& acc, const float* __restrict__ g, i64 n, const GradRegion& reg, int p) {
  const i64 chunks = (reg.total + 3) / 4;
  for (i64 c = (i64)p * GRAD_BLOCK + threadIdx.x; c < chunks; c += (i64)GRAD_PARTIALS * GRAD_BLOCK) {
    float v[4];
    reg.load(v, g, n, c);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc += (double)v[j] * (double)v[j];
  }
}

MF_DEVICE void region_scale(float* __restrict__ g, i64 n, const GradRegion& reg, float coef) {
  const i64 chunks = (reg.total + 3) / 4, stride = (i64)gridDim.x * blockDim.x;
  for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += stride) reg.scale(g, n, c, coef);
}

// ---- clip coefficient: total = partials[0] + partials[1] + ... + partials[num_partials-1], one f64 chain in
// ascending order run by one thread (the block only stages the partials in shared memory, 512 at a time, so the
// serial chain reads shared memory, not global); norm = sqrt(total) (f64, the pre-clip norm),
// coef = min(1, max_norm / (norm + eps)) (NaN propagates). ----
MF_DEVICE void grad_clip_coef(float* __restrict__ coef, float* __restrict__ norm, const double* __restrict__ partials,
                              int num_partials, float max_norm, float eps) {
  __shared__ double stage[GRAD_PARTIALS];
  if (blockIdx.x != 0) return;
  double total = 0.0;  // meaningful in thread 0 only
  for (int base = 0; base < num_partials; base += GRAD_PARTIALS) {
    const int cnt = min(GRAD_PARTIALS, num_partials - base);
    for (int i = threadIdx.x; i < cnt; i += blockDim.x) stage[i] = partials[base + i];
    __syncthreads();
    if (threadIdx.x == 0)
      for (int i = 0; i < cnt; ++i) total += stage[i];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double nrm = sqrt(total);
    double c = (double)max_norm / (nrm + (double)eps);
    c = c > 1.0 ? 1.0 : c;
    coef[0] = (float)c;
    norm[0] = (float)nrm;
  }
}

// ---- AdamW (torch.optim.AdamW, amsgrad off, maximize off), per element in f32:
//   p *= 1 - lr*wd; m += (1-b1)*(g-m); v = v*b2 + (1-b2)*g*g;
//   p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
// The step-dependent scalars are formed in f64 and rounded to f32 once, as torch does with Python floats. ----
struct AdamWConsts {
  float decay, one_m_b1, b2, one_m_b2, step_size, bc2_sqrt, eps;
};

// b^t for an integer t >= 0 by binary exponentiation in f64: a fixed sequence of correctly rounded products
// (no libm pow, which is an out-of-line call), accurate to a few f64 ulps for any step count.
MF_DEVICE double pow_int(double b, long long t) {
  double r = 1.0;
  for (; t > 0; t >>= 1) {
    if (t & 1) r = __dmul_rn(r, b);
    b = __dmul_rn(b, b);
  }
  return r;
}

MF_DEVICE AdamWConsts adamw_consts(float lr, float beta1, float beta2, float eps, float wd, long long step) {
  AdamWConsts k;
  k.decay = (float)(1.0 - (double)lr * (double)wd);
  k.one_m_b1 = (float)(1.0 - (double)beta1);
  k.b2 = beta2;
  k.one_m_b2 = (float)(1.0 - (double)beta2);
  k.step_size = (float)((double)lr / (1.0 - pow_int((double)beta1, step)));
  k.bc2_sqrt = (float)sqrt(1.0 - pow_int((double)beta2, step));
  k.eps = eps;
  return k;
}

MF_DEVICE void adamw_elem(float& p, float g, float& m, float& v, const AdamWConsts& k, float decay) {
  p = p * decay;
  m = m + k.one_m_b1 * (g - m);
  v = v * k.b2 + k.one_m_b2 * (g * g);
  const float denom = sqrtf(v) / k.bc2_sqrt + k.eps;
  p = p - k.step_size * (m / denom);
}

MF_DEVICE void adamw_span(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                          float* __restrict__ v, i64 n, const AdamWConsts& k) {
  const bool vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v);
  const i64 chunks = (n + 3) / 4, stride = (i64)gridDim.x * blockDim.x;
  for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    float pv[4], gv[4], mv[4], vv[4];
    load4(pv, p, c, n, vec);
    load4(gv, g, c, n, vec);
    load4(mv, m, c, n, vec);
    load4(vv, v, c, n, vec);
#pragma unroll
    for (int j = 0; j < 4; ++j) adamw_elem(pv[j], gv[j], mv[j], vv[j], k, k.decay);
    store4(p, pv, c, n, vec);
    store4(m, mv, c, n, vec);
    store4(v, vv, c, n, vec);
  }
}

// Capturable: lr = *lr_dev, t = *step + 1 read by every block; the last block to arrive (integer counter,
// left at 0 again) stores *step = t, so no block can see the incremented count within the launch.
MF_DEVICE void adamw_capturable(float* p, const float* g, float* m, float* v, i64 n, const float* lr_dev, int* step,
                                unsigned int* arrivals, float beta1, float beta2, float eps, float wd) {
  __shared__ float s_lr;
  __shared__ int s_step;
  __shared__ bool s_last;
  if (threadIdx.x == 0) {
    s_lr = __ldcg(lr_dev);
    s_step = __ldcg(step) + 1;
  }
  __syncthreads();
  const AdamWConsts k = adamw_consts(s_lr, beta1, beta2, eps, wd, s_step);
  adamw_span(p, g, m, v, n, k);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    s_last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (s_last && threadIdx.x == 0) {
    *step = s_step;
    *arrivals = 0u;
    __threadfence();
  }
}

// ---- multi-tensor AdamW. One launch walks a device array of descriptors (layout: AdamWTensorDesc below,
// 48 bytes each). The concatenation of every tensor's 2048-element chunks is dealt round-robin to the blocks:
// block b takes global chunks b, b + gridDim.x, ... Elementwise, so no order question arises. ----
struct AdamWTensorDesc {
  u64 param;           //  0: T*            params, updated in place (read as f32, rounded to nearest)
  u64 grad;            //  8: const T*      gradients
  u64 exp_avg;         // 16: float*        m (f32 master state)
  u64 exp_avg_sq;      // 24: float*        v (f32 master state)
  i64 numel;           // 32: elements
  float weight_decay;  // 40: per tensor (0 for norms and biases)
  u32 reserved;        // 44: 0
};
static_assert(sizeof(AdamWTensorDesc) == 48, "descriptor layout is part of the ABI");

constexpr int MULTI_EPT = 8;  // elements per thread per chunk: one 16-byte vector of 16-bit T, two of f32
constexpr int MULTI_CHUNK = OPT_BLOCK * MULTI_EPT;

template <typename T> MF_DEVICE void store8(T* base, const float* src, i64 i, i64 n, bool vec) {
  constexpr int N = Vec<T>::N;
  if (vec && i + MULTI_EPT <= n) {
#pragma unroll
    for (int h = 0; h < MULTI_EPT / N; ++h) {
      Vec<T> r;
#pragma unroll
      for (int j = 0; j < N; ++j) r.v[j] = from_f32<T>(src[h * N + j]);
      store_vec(base + i + h * N, r);
    }
  } else {
#pragma unroll
    for (int j = 0; j < MULTI_EPT; ++j)
      if (i + j < n) base[i + j] = from_f32<T>(src[j]);
  }
}

template <typename T>
MF_DEVICE void adamw_multi(const AdamWTensorDesc* __restrict__ descs, int num_tensors, float lr, float beta1,
                           float beta2, float eps, int step) {
  const AdamWConsts k = adamw_consts(lr, beta1, beta2, eps, 0.f, step);
  i64 first = 0;  // global chunk index of this tensor's chunk 0
  for (int t = 0; t < num_tensors; ++t) {
    const AdamWTensorDesc dsc = descs[t];
    T* p = reinterpret_cast<T*>(dsc.param);
    const T* g = reinterpret_cast<const T*>(dsc.grad);
    float* m = reinterpret_cast<float*>(dsc.exp_avg);
    float* v = reinterpret_cast<float*>(dsc.exp_avg_sq);
    const i64 n = dsc.numel > 0 ? dsc.numel : 0;
    const i64 chunks = (n + MULTI_CHUNK - 1) / MULTI_CHUNK;
    const float decay = (float)(1.0 - (double)lr * (double)dsc.weight_decay);
    const bool vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v);
    i64 c = ((i64)blockIdx.x - first) % gridDim.x;  // first chunk of this tensor dealt to this block
    if (c < 0) c += gridDim.x;
    for (; c < chunks; c += gridDim.x) {
      const i64 i = c * MULTI_CHUNK + (i64)threadIdx.x * MULTI_EPT;
      float pv[MULTI_EPT], gv[MULTI_EPT], mv[MULTI_EPT], vv[MULTI_EPT];
      load_chunk<MULTI_EPT>(pv, p, i, n, vec);
      load_chunk<MULTI_EPT>(gv, g, i, n, vec);
      load_chunk<MULTI_EPT>(mv, m, i, n, vec);
      load_chunk<MULTI_EPT>(vv, v, i, n, vec);
#pragma unroll
      for (int j = 0; j < MULTI_EPT; ++j) adamw_elem(pv[j], gv[j], mv[j], vv[j], k, decay);
      store8<T>(p, pv, i, n, vec);
      store8<float>(m, mv, i, n, vec);
      store8<float>(v, vv, i, n, vec);
    }
    first += chunks;
  }
}

// ---- kernel bodies: each symbol's extern "C" wrapper is generated from kernels/fixed/optim.toml (its params and
// bounds: mamba_forge/catalog/wrappers.py) and calls the body its family names, with every parameter in order:
// check_inf_nan, scale_span, grad_clip_coef, adamw_capturable and adamw_multi<T> above, or one of these.

MF_DEVICE void scale_grads_dev(float* __restrict__ g, i64 n, const float* __restrict__ scale) { scale_span(g, n, *scale); }

MF_DEVICE void scale_grads_skip(float* __restrict__ g, i64 n, const float* __restrict__ scale,
                                const int* __restrict__ found) {
  if (*found != 0) return;
  scale_span(g, n, *scale);
}

MF_DEVICE void grad_sumsq_partial(double* __restrict__ partials, const float* __restrict__ g, i64 n) {
  sumsq_partials(partials, [&](double& acc, int p) { sumsq_span(acc, g, n, p); });
}

// Our span-list twin: each span [offsets[r], offsets[r]+lengths[r]) clamped to [0, n), in list order, each
// chunked from its own start.
MF_DEVICE void grad_spans_sumsq_partial(double* __restrict__ partials, const float* __restrict__ g, i64 n,
                                        const i64* __restrict__ offsets, const i64* __restrict__ lengths,
                                        int num_spans) {
  sumsq_partials(partials, [&](double& acc, int p) {
    for (int r = 0; r < num_spans; ++r) {
      i64 base, len;
      if (span_bounds(base, len, offsets, lengths, r, n)) sumsq_span(acc, g + base, len, p);
    }
  });
}

MF_DEVICE void grad_region_sumsq_partial(double* __restrict__ partials, const float* __restrict__ g, i64 n,
                                         i64 stripe_off, int stripe_rows, int stripe_cols, i64 stripe_ld,
                                         i64 vec_off, i64 vec_len) {
  const GradRegion reg(stripe_off, stripe_rows, stripe_cols, stripe_ld, vec_off, vec_len);
  sumsq_partials(partials, [&](double& acc, int p) { region_sumsq(acc, g, n, reg, p); });
}

MF_DEVICE void grad_spans_scale_dev(float* __restrict__ g, i64 n, const i64* __restrict__ offsets,
                                    const i64* __restrict__ lengths, int num_spans, const float* __restrict__ coef) {
  const float c = *coef;
  for (int r = 0; r < num_spans; ++r) {
    i64 base, len;
    if (span_bounds(base, len, offsets, lengths, r, n)) scale_span(g + base, len, c);
  }
}

MF_DEVICE void grad_region_scale_dev(float* __restrict__ g, i64 n, i64 stripe_off, int stripe_rows, int stripe_cols,
                                     i64 stripe_ld, i64 vec_off, i64 vec_len, const float* __restrict__ coef) {
  const GradRegion reg(stripe_off, stripe_rows, stripe_cols, stripe_ld, vec_off, vec_len);
  region_scale(g, n, reg, *coef);
}

MF_DEVICE void adamw_step(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                          float* __restrict__ v, i64 n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, int step) {
  const AdamWConsts k = adamw_consts(lr, beta1, beta2, eps, weight_decay, step);
  adamw_span(p, g, m, v, n, k);
}

}  // namespace mf
