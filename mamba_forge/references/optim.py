"""float64 references for the training-step kernels (kernels/fixed/optim.{cu,toml}): inf/nan detection, gradient
(un)scaling, deterministic gradient-norm clipping and AdamW as torch.optim.AdamW.

Host f32 scalars (lr, betas, scale, ...) are rounded to float32 first: that is the value the kernel receives.
The partial sums of squares follow the kernels' fixed assignment of elements to partials exactly (the order
inside a partial differs, which float64 absorbs). Entry points named by the catalog take ``(args, dims)``.
"""

from __future__ import annotations

import struct

import numpy as np

GRAD_PARTIALS = 512  # the fixed grid of partial sums (kernels/fixed/optim.cu: GRAD_PARTIALS)
GRAD_BLOCK = 256  # threads per partial
CHUNK = 4  # elements per thread per step


def f32(v) -> float:
    return float(np.float32(v))


# ---- building blocks ----


def any_nonfinite(x: np.ndarray) -> bool:
    return not bool(np.all(np.isfinite(np.asarray(x, dtype=np.float64))))


def sumsq_partials(g: np.ndarray) -> np.ndarray:
    """partials[p] = sum of squares of the elements the kernel deals to virtual block p: chunk c (elements
    [4c, 4c+4)) belongs to p = (c // GRAD_BLOCK) % GRAD_PARTIALS."""
    g = np.asarray(g, dtype=np.float64).ravel()
    chunks = -(-g.size // CHUNK)
    padded = np.zeros(chunks * CHUNK)
    padded[: g.size] = g
    with np.errstate(over="ignore", invalid="ignore"):
        sq = (padded * padded).reshape(chunks, CHUNK).sum(axis=1)
    owner = (np.arange(chunks) // GRAD_BLOCK) % GRAD_PARTIALS
    return np.bincount(owner, weights=sq, minlength=GRAD_PARTIALS)


def span_bounds(offsets, lengths, n: int) -> list[tuple[int, int]]:
    """Each span [off, off + len) clamped to [0, n), as the kernels clamp it."""
    out = []
    for off, ln in zip(np.asarray(offsets).ravel(), np.asarray(lengths).ravel(), strict=True):
        lo = min(max(int(off), 0), n)
        hi = min(max(int(off) + int(ln), lo), n)
        out.append((lo, hi))
    return out


def spans_sumsq_partials(g, offsets, lengths) -> np.ndarray:
    g = np.asarray(g, dtype=np.float64).ravel()
    total = np.zeros(GRAD_PARTIALS)
    for lo, hi in span_bounds(offsets, lengths, g.size):
        if hi > lo:
            total = total + sumsq_partials(g[lo:hi])
    return total


def region_addresses(n: int, stripe_off: int, rows: int, cols: int, ld: int, vec_off: int, vec_len: int) -> np.ndarray:
    """Addresses of the per-layer region's elements in region order: the stripe (rows x cols at stripe_off + r*ld
    + c, row by row), then the vector [vec_off, vec_off + vec_len). Some may lie outside [0, n): absent."""
    rows, cols, vec_len = max(int(rows), 0), max(int(cols), 0), max(int(vec_len), 0)
    stripe = (int(stripe_off) + np.arange(rows, dtype=np.int64)[:, None] * int(ld)
              + np.arange(cols, dtype=np.int64)[None, :]).ravel()
    return np.concatenate([stripe, int(vec_off) + np.arange(vec_len, dtype=np.int64)])


def region_values(g, addresses) -> np.ndarray:
    """The region's values in region order, 0 where the address is outside the arena."""
    g = np.asarray(g, dtype=np.float64).ravel()
    inside = (addresses >= 0) & (addresses < g.size)
    out = np.zeros(addresses.size)
    out[inside] = g[addresses[inside]]
    return out


def _region_args(args) -> np.ndarray:
    return region_addresses(int(args["n"]), args["stripe_off"], args["stripe_rows"], args["stripe_cols"],
                            args["stripe_ld"], args["vec_off"], args["vec_len"])


def clip_coef(partials: np.ndarray, max_norm: float, eps: float) -> tuple[float, float]:
    """(coef, norm): norm = sqrt(sum(partials)) (the kernel's one ascending chain; float64 here), coef = min(1, max_norm / (norm + eps)); NaN propagates."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        norm = float(np.sqrt(np.sum(np.asarray(partials, dtype=np.float64))))
        c = f32(max_norm) / (norm + f32(eps))
    return (1.0 if c > 1.0 else c), norm


def adamw(p, g, m, v, *, lr, beta1, beta2, eps, weight_decay, step):
    """One torch.optim.AdamW step (amsgrad off, maximize off) in float64; step is the 1-based count of this
    update. Returns new (p, m, v)."""
    lr, beta1, beta2, eps, weight_decay = (f32(a) for a in (lr, beta1, beta2, eps, weight_decay))
    p, g, m, v = (np.asarray(a, dtype=np.float64) for a in (p, g, m, v))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        p = p * (1.0 - lr * weight_decay)
        m = m + (1.0 - beta1) * (g - m)
        v = v * beta2 + (1.0 - beta2) * (g * g)
        step_size = lr / (1.0 - beta1**step)
        bc2_sqrt = np.sqrt(1.0 - beta2**step)
        p = p - step_size * (m / (np.sqrt(v) / bc2_sqrt + eps))
    return p, m, v


# ---- catalog entry points ----


def check_inf_nan(args, dims):
    found = np.asarray(args["found"]).copy()
    if any_nonfinite(args["x"]):
        found[0] = 1
    return {"found": found}


def scale_grads(args, dims):
    with np.errstate(over="ignore", invalid="ignore"):
        return {"g": np.asarray(args["g"], dtype=np.float64) * f32(args["scale"])}


def scale_grads_dev(args, dims):
    with np.errstate(over="ignore", invalid="ignore"):
        return {"g": np.asarray(args["g"], dtype=np.float64) * float(np.asarray(args["scale"]).ravel()[0])}


def scale_grads_skip(args, dims):
    if int(np.asarray(args["found"]).ravel()[0]) != 0:
        return {"g": np.asarray(args["g"], dtype=np.float64).copy()}
    return scale_grads_dev(args, dims)


def grad_sumsq_partial(args, dims):
    g = np.asarray(args["g"], dtype=np.float64)[: int(args["n"])]
    return {"partials": sumsq_partials(g)}


def grad_region_sumsq_partial(args, dims):
    g = np.asarray(args["g"], dtype=np.float64)[: int(args["n"])]
    return {"partials": sumsq_partials(region_values(g, _region_args(args)))}


def grad_spans_sumsq_partial(args, dims):
    n, r = int(args["n"]), int(args["num_spans"])
    g = np.asarray(args["g"], dtype=np.float64)[:n]
    return {"partials": spans_sumsq_partials(g, np.asarray(args["offsets"])[:r], np.asarray(args["lengths"])[:r])}


def grad_clip_coef(args, dims):
    partials = np.asarray(args["partials"], dtype=np.float64)[: int(args["num_partials"])]
    coef, norm = clip_coef(partials, args["max_norm"], args["eps"])
    return {"coef": np.array([coef]), "norm": np.array([norm])}


def grad_region_scale_dev(args, dims):
    n = int(args["n"])
    g = np.asarray(args["g"], dtype=np.float64).copy()
    c = float(np.asarray(args["coef"]).ravel()[0])
    a = _region_args(args)
    a = a[(a >= 0) & (a < n)]
    with np.errstate(over="ignore", invalid="ignore"):
        g[a] = g[a] * c
    return {"g": g}


def grad_spans_scale_dev(args, dims):
    n, r = int(args["n"]), int(args["num_spans"])
    g = np.asarray(args["g"], dtype=np.float64).copy()
    c = float(np.asarray(args["coef"]).ravel()[0])
    with np.errstate(over="ignore", invalid="ignore"):
        for lo, hi in span_bounds(np.asarray(args["offsets"])[:r], np.asarray(args["lengths"])[:r], n):
            g[lo:hi] = g[lo:hi] * c
    return {"g": g}


def _adamw_args(args, step):
    return adamw(args["p"], args["g"], args["m"], args["v"], lr=args["lr"], beta1=args["beta1"],
                 beta2=args["beta2"], eps=args["eps"], weight_decay=args["weight_decay"], step=step)


def adamw_step(args, dims):
    p, m, v = _adamw_args(args, int(args["step"]))
    return {"p": p, "m": m, "v": v}


def adamw_step_capturable(args, dims):
    step = int(np.asarray(args["step"]).ravel()[0]) + 1
    lr = float(np.asarray(args["lr"]).ravel()[0])
    p, m, v = _adamw_args({**args, "lr": lr}, step)
    return {"p": p, "m": m, "v": v, "step": np.array([step]), "arrivals": np.array([0])}


# ---- multi-tensor AdamW: the qualifier's tensor list (shared by the prepare hook and the reference) ----

MULTI_DESC_BYTES = 48  # AdamWTensorDesc in kernels/fixed/optim.cu
_MULTI_DESC = struct.Struct("<QQQQqfI")  # param, grad, exp_avg, exp_avg_sq, numel, weight_decay, reserved
MULTI_WEIGHT_DECAY = 0.1  # every fourth tensor (t % 4 == 3) gets 0, like norms and biases


def multi_tensor_sizes(total: int, tensors: int) -> list[int]:
    """Split `total` elements into `tensors` contiguous tensors of uneven, mostly odd sizes, in order.

    Weights 1..17 from a fixed quadratic rule; each size is made odd (so consecutive starts alternate between
    16-byte aligned and unaligned, exercising the kernel's vector and scalar paths); the last tensor takes the
    remainder. Deterministic: the prepare hook and the reference call this with the same dims."""
    if tensors < 1 or total < tensors:
        raise ValueError(f"cannot split {total} elements into {tensors} non-empty tensors")
    weights = [(3 * t * t + 5 * t + 1) % 17 + 1 for t in range(tensors)]
    wsum = sum(weights)
    sizes = []
    for t in range(tensors - 1):
        s = max(1, total * weights[t] // wsum)
        if s % 2 == 0:
            s -= 1
        sizes.append(s)
    last = total - sum(sizes)
    if last < 1:
        raise ValueError(f"cannot split {total} elements into {tensors} non-empty tensors")
    sizes.append(last)
    return sizes


def multi_weight_decay(t: int) -> float:
    return 0.0 if t % 4 == 3 else MULTI_WEIGHT_DECAY


def adamw_multi_descriptors(pointers, scalars, dims) -> dict[str, bytes]:
    """QualifySpec.prepare for adamw_step_multi_*: the `descs` table of 48-byte descriptors pointing into the
    aux pools param/grad (T) and exp_avg/exp_avg_sq (f32), split by multi_tensor_sizes. `dims` carries
    sizeof_T (the harness passes the instance environment)."""
    tensors, total = int(dims["tensors"]), int(dims["total"])
    tsize = int(dims["sizeof_T"])
    if int(scalars["num_tensors"]) != tensors:
        raise ValueError(f"num_tensors {scalars['num_tensors']} != dims.tensors {tensors}")
    out, start = bytearray(), 0
    for t, n in enumerate(multi_tensor_sizes(total, tensors)):
        out += _MULTI_DESC.pack(pointers["param"] + start * tsize, pointers["grad"] + start * tsize,
                                pointers["exp_avg"] + start * 4, pointers["exp_avg_sq"] + start * 4,
                                n, multi_weight_decay(t), 0)
        start += n
    return {"descs": bytes(out)}


def adamw_step_multi(args, dims):
    """Reference for adamw_step_multi_*: adamw_step over each tensor of the aux pools with its weight decay."""
    total, tensors = int(dims["total"]), int(args["num_tensors"])
    pools = {k: np.asarray(args[k], dtype=np.float64)[:total] for k in ("param", "grad", "exp_avg", "exp_avg_sq")}
    p, m, v = (np.empty(total) for _ in range(3))
    start = 0
    for t, n in enumerate(multi_tensor_sizes(total, tensors)):
        s = slice(start, start + n)
        p[s], m[s], v[s] = adamw(pools["param"][s], pools["grad"][s], pools["exp_avg"][s], pools["exp_avg_sq"][s],
                                 lr=args["lr"], beta1=args["beta1"], beta2=args["beta2"], eps=args["eps"],
                                 weight_decay=multi_weight_decay(t), step=int(args["step"]))
        start += n
    return {"param": p, "exp_avg": m, "exp_avg_sq": v}
