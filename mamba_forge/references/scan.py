"""float64 references for the selective-scan family (kernels/fixed/scan.{cu,toml}): Mamba-1 `selective_scan_ref`.

Layouts (flat arrays, as the kernels see them): u, delta, z, out, du, ddelta, dz [batch, d_inner, L];
B, C [batch, d_state, L]; A_log [d_inner, d_state] with A = -exp(A_log); D, delta_bias [d_inner];
states [batch, d_inner, d_state]; saved states [batch, d_inner, ceil(L/256), d_state] (the state before timestep 256c).

Each public function named after a family follows the reference convention of `mamba_forge.references`:
fn(args, dims) -> {output name: expected float64 contents, flat}. The array-level helpers (`scan_forward`,
`scan_backward`) are what those wrap and what the tests compare against a literal step-by-step loop.
"""

from __future__ import annotations

import numpy as np

from mamba_forge.core.errors import ForgeError

SAVE_CHUNK = 256  # timesteps between saved states (kernels: mf::kScanSaveChunk)
BWD_GROUP = {"ssm_parallel_scan_bwd": 4, "ssm_parallel_scan_bwd_fold": 8, "ssm_parallel_scan_bwd_fold_tokens": 8,
             "ssm_backward_local": 4}
# Families whose kernels hold per-channel state sized by the built capacity (all of the sequence/step kernels).
STATE_FAMILIES = (
    "ssm_step_forward", "ssm_step_forward_fused", "ssm_step_forward_fused_v", "ssm_burnin_forward",
    "ssm_burnin_forward_nosave", "ssm_parallel_scan_fwd", "ssm_parallel_scan_fwd_nosave", "ssm_parallel_scan_bwd", "ssm_parallel_scan_bwd_fold",
    "ssm_parallel_scan_bwd_fold_tokens", "ssm_backward_local",
)


# ---------------------------------------------------------------------------------------------------------
# launch checks (host side, before any launch)

def check_launch(family: str, dims: dict[str, int], state_capacity: int) -> None:
    """Refuse a launch the kernels cannot serve: d_state above the built capacity (the kernels would return
    without writing), a backward whose d_inner is not a multiple of its channel group, empty shapes."""
    d_state = dims.get("d_state")
    if family in STATE_FAMILIES:
        if d_state is None or d_state < 1:
            raise ForgeError(f"{family}: d_state must be at least 1, got {d_state!r}")
        if d_state > state_capacity:
            raise ForgeError(
                f"{family}: d_state {d_state} is above the built state capacity {state_capacity}",
                hint=f"rebuild with --state-cap {d_state} (the build manifest records state_capacity)",
            )
    for k in ("batch", "d_inner", "L"):
        if k in dims and dims[k] < 1:
            raise ForgeError(f"{family}: {k} must be at least 1, got {dims[k]}")
    w = BWD_GROUP.get(family)
    if w is not None and dims["d_inner"] % w:
        raise ForgeError(f"{family}: d_inner {dims['d_inner']} is not a multiple of the channel group {w}")


# ---------------------------------------------------------------------------------------------------------
# array-level math

def _softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _delta(delta, delta_bias, softplus):
    x = delta + (0.0 if delta_bias is None else delta_bias[None, :, None])
    return _softplus(x) if softplus else x


def scan_forward(u, delta, A_log, B, C, D=None, z=None, delta_bias=None, softplus=True, h0=None, saved=None):
    """Shapes: u, delta, z [b, d, L]; B, C [b, n, L]; A_log [d, n]; D, delta_bias [d]; h0 [b, d, n].
    `saved` [b, d, nc, n]: if given, the state before timestep 256c is replaced by saved[:, :, c] (the backward's
    per-chunk replay contract). Returns (out [b, d, L], states [b, d, n, L] after each step, last [b, d, n])."""
    bsz, d_inner, L = u.shape
    n = A_log.shape[1]
    A = -np.exp(A_log)
    dl = _delta(delta, delta_bias, softplus)
    h = np.zeros((bsz, d_inner, n)) if h0 is None else np.array(h0, dtype=np.float64)
    states = np.empty((bsz, d_inner, n, L))
    y = np.empty((bsz, d_inner, L))
    for t in range(L):
        if saved is not None and t % SAVE_CHUNK == 0:
            h = saved[:, :, t // SAVE_CHUNK, :].copy()
        da = np.exp(dl[:, :, t, None] * A[None])
        h = da * h + (dl[:, :, t] * u[:, :, t])[:, :, None] * B[:, None, :, t]
        states[:, :, :, t] = h
        y[:, :, t] = np.einsum("bdn,bn->bd", h, C[:, :, t])
    if D is not None:
        y = y + D[None, :, None] * u
    out = y * (z * _sigmoid(z)) if z is not None else y
    return out, states, h


def saved_states(states: np.ndarray, h0: np.ndarray | None = None) -> np.ndarray:
    """saved[b, d, c, n] = the state before timestep 256c, from the per-step states of scan_forward."""
    bsz, d_inner, n, L = states.shape
    nc = -(-L // SAVE_CHUNK)
    out = np.empty((bsz, d_inner, nc, n))
    for c in range(nc):
        t = c * SAVE_CHUNK
        out[:, :, c] = (np.zeros((bsz, d_inner, n)) if h0 is None else h0) if t == 0 else states[:, :, :, t - 1]
    return out


def scan_backward(dout, u, delta, A_log, B, C, D=None, z=None, delta_bias=None, softplus=True, saved=None,
                  h0=None, dh_last=None):
    """Analytic backward of scan_forward (same `saved` replay; gradients flow across chunk boundaries as through
    the continuous recurrence). Returns a dict of full gradients per (b, d, ...) before any cross-d/b reduction:
    du, ddelta (raw delta), dz [b,d,L]; dB_bd, dC_bd [b,d,n,L] (per channel); dA [b,d,n] (w.r.t. A);
    dD [b,d]; dbias [b,d]; dh0 [b,d,n]."""
    bsz, d_inner, L = u.shape
    n = A_log.shape[1]
    A = -np.exp(A_log)
    x = delta + (0.0 if delta_bias is None else delta_bias[None, :, None])
    dl = _softplus(x) if softplus else x
    out, states, _ = scan_forward(u, delta, A_log, B, C, D, z, delta_bias, softplus, h0, saved)
    del out
    y = np.einsum("bdnl,bnl->bdl", states, C) + (0.0 if D is None else D[None, :, None] * u)  # before the gate
    if z is not None:
        s = _sigmoid(z)
        dy = dout * z * s
        dz = dout * y * s * (1.0 + z * (1.0 - s))
    else:
        dy, dz = dout, np.zeros_like(dout)
    # h_{t-1}: the state each step starts from (with the saved replay)
    hprev = np.empty_like(states)
    for t in range(L):
        if saved is not None and t % SAVE_CHUNK == 0:
            hprev[..., t] = saved[:, :, t // SAVE_CHUNK, :]
        elif t == 0:
            hprev[..., t] = 0.0 if h0 is None else h0
        else:
            hprev[..., t] = states[..., t - 1]
    a = np.exp(dl[:, :, None, :] * A[None, :, :, None])  # [b,d,n,L]
    g = np.empty_like(states)
    q = np.zeros((bsz, d_inner, n)) if dh_last is None else np.array(dh_last, dtype=np.float64)
    for t in range(L - 1, -1, -1):
        g[..., t] = C[:, None, :, t] * dy[:, :, None, t] + q
        q = a[..., t] * g[..., t]
    Bx = B[:, None, :, :]
    du = (D[None, :, None] * dy if D is not None else 0.0) + np.einsum("bdnl,bdl,bdnl->bdl", g, dl, np.broadcast_to(Bx, g.shape))
    ddl = np.einsum("bdnl->bdl", g * (A[None, :, :, None] * a * hprev + Bx * u[:, :, None, :]))
    dsp = np.where(x <= 20.0, _sigmoid(x), 1.0) if softplus else np.ones_like(x)
    ddelta = ddl * dsp
    return {
        "du": du, "ddelta": ddelta, "dz": dz,
        "dB_bd": g * (dl * u)[:, :, None, :],
        "dC_bd": dy[:, :, None, :] * states,
        "dA": np.einsum("bdnl->bdn", g * dl[:, :, None, :] * a * hprev),
        "dD": np.einsum("bdl->bd", dy * u),
        "dbias": ddelta.sum(axis=2),
        "dh0": q,
        "y": y,
    }


def group_sum(per_d: np.ndarray, w: int) -> np.ndarray:
    """[b, d, n, L] per-channel partials -> [b, d // w, n, L] sums over each group of w consecutive channels."""
    bsz, d_inner, n, L = per_d.shape
    return per_d.reshape(bsz, d_inner // w, w, n, L).sum(axis=2)


# ---------------------------------------------------------------------------------------------------------
# family references: fn(args, dims) -> {output: flat float64}

def _seq_inputs(args, dims):
    b, d, n, L = dims["batch"], dims["d_inner"], dims["d_state"], dims["L"]
    r = lambda k, *shape: np.asarray(args[k], dtype=np.float64).reshape(shape)  # noqa: E731
    return dict(
        u=r("u", b, d, L), delta=r("delta", b, d, L), A_log=r("A_log", d, n), B=r("Bm", b, n, L), C=r("Cm", b, n, L),
        D=r("Dp", d), z=r("z", b, d, L), delta_bias=r("delta_bias", d), softplus=bool(args.get("delta_softplus", 1)),
    )


def ssm_step_forward(args, dims):
    b, d, n = dims["batch"], dims["d_inner"], dims["d_state"]
    h = np.asarray(args["state"], dtype=np.float64).reshape(b, d, n)
    dt = np.asarray(args["delta"], dtype=np.float64).reshape(b, d)
    u = np.asarray(args["u"], dtype=np.float64).reshape(b, d)
    A = -np.exp(np.asarray(args["A_log"], dtype=np.float64).reshape(d, n))
    Bm = np.asarray(args["Bm"], dtype=np.float64).reshape(b, n)
    Cm = np.asarray(args["Cm"], dtype=np.float64).reshape(b, n)
    h = np.exp(dt[:, :, None] * A[None]) * h + (dt * u)[:, :, None] * Bm[:, None, :]
    y = np.einsum("bdn,bn->bd", h, Cm) + np.asarray(args["Dp"], dtype=np.float64)[None, :] * u
    return {"y": y.ravel(), "state": h.ravel()}


def ssm_step_forward_fused(args, dims):
    b, d, n, r = dims["batch"], dims["d_inner"], dims["d_state"], dims["dt_rank"]
    stride = r + 2 * n
    x = np.asarray(args["x_dbl"], dtype=np.float64).reshape(b, stride)
    dt = _softplus(np.asarray(args["dt"], dtype=np.float64).reshape(b, d) + np.asarray(args["dt_bias"], dtype=np.float64)[None])
    plain = {"state": args["state"], "delta": dt.ravel(), "u": args["u"], "A_log": args["A_log"],
             "Bm": x[:, r:r + n].ravel(), "Cm": x[:, r + n:r + 2 * n].ravel(), "Dp": args["Dp"]}
    res = ssm_step_forward(plain, dims)
    zs = d + dims.get("z_pad", 0)  # z's rows d_inner + z_pad apart (the layer's xz second half, in place)
    zf = np.asarray(args["z"], dtype=np.float64)
    z = np.stack([zf[i * zs:i * zs + d] for i in range(b)]).ravel()
    return {"out": res["y"] * z * _sigmoid(z), "state": res["state"]}


def ssm_step_forward_fused_v(args, dims):
    """The decode-step candidates (kernels/include/mf/decode.cuh) share ssm_step_forward_fused's contract."""
    return ssm_step_forward_fused(args, dims)


def ssm_step_forward_fused_state16(args, dims):
    """The step on a 16-bit state: the contract of ssm_step_forward_fused on the state's (already rounded) values;
    the kernel's rounding of the new state lies within the 16-bit tolerances the qualifier compares with."""
    return ssm_step_forward_fused(args, dims)


def ssm_burnin_forward_nosave(args, dims):
    b, d, n = dims["batch"], dims["d_inner"], dims["d_state"]
    h0 = np.asarray(args["state"], dtype=np.float64).reshape(b, d, n)
    out, _, last = scan_forward(**_seq_inputs(args, dims), h0=h0)
    return {"out": out.ravel(), "state": last.ravel()}


def ssm_burnin_forward(args, dims):
    b, d, n = dims["batch"], dims["d_inner"], dims["d_state"]
    h0 = np.asarray(args["state"], dtype=np.float64).reshape(b, d, n)
    out, states, last = scan_forward(**_seq_inputs(args, dims), h0=h0)
    return {"out": out.ravel(), "state": last.ravel(), "saved": saved_states(states, h0).ravel()}


def ssm_parallel_scan_fwd_nosave(args, dims):
    out, _, last = scan_forward(**_seq_inputs(args, dims))
    return {"out": out.ravel(), "last_state": last.ravel()}


def ssm_parallel_scan_fwd(args, dims):
    out, states, last = scan_forward(**_seq_inputs(args, dims))
    return {"out": out.ravel(), "last_state": last.ravel(), "saved": saved_states(states).ravel()}


def _bwd(args, dims, w, local):
    b, d, n, L = dims["batch"], dims["d_inner"], dims["d_state"], dims["L"]
    nc = -(-L // SAVE_CHUNK)
    saved = np.asarray(args["saved"], dtype=np.float64).reshape(b, d, nc, n)
    dh_last = np.asarray(args["dh_last"], dtype=np.float64).reshape(b, d, n) if local else None
    dout = np.asarray(args["dout"], dtype=np.float64).reshape(b, d, L)
    gr = scan_backward(dout, **_seq_inputs(args, dims), saved=saved, dh_last=dh_last)
    res = {
        "du": gr["du"].ravel(), "ddelta": gr["ddelta"].ravel(), "dz": gr["dz"].ravel(),
        "dB_part": group_sum(gr["dB_bd"], w).ravel(), "dC_part": group_sum(gr["dC_bd"], w).ravel(),
        "dA_part": gr["dA"].ravel(), "dD_part": gr["dD"].ravel(), "dbias_part": gr["dbias"].ravel(),
    }
    if local:
        res["dh0"] = gr["dh0"].ravel()
    return res


def ssm_parallel_scan_bwd(args, dims):
    return _bwd(args, dims, 4, False)


def ssm_parallel_scan_bwd_fold(args, dims):
    return _bwd(args, dims, 8, False)


def ssm_backward_local(args, dims):
    return _bwd(args, dims, 4, True)


def _row_index(b: int, L: int, cols: int, ld: int) -> np.ndarray:
    """Flat positions of [b * L, cols] held in rows ld elements apart."""
    return np.arange(b * L)[:, None] * ld + np.arange(cols)[None, :]


def ssm_parallel_scan_bwd_fold_tokens(args, dims):
    """ssm_parallel_scan_bwd_fold on token-major operands: u, delta, dout, du, ddelta [batch * L, d_inner]; z and dz
    rows z_ld apart (dz is inout: what lies between its rows keeps its values); B, C rows bc_ld apart. The partials
    keep the channel-major kernel's layouts."""
    b, d, n, L = dims["batch"], dims["d_inner"], dims["d_state"], dims["L"]
    z_ld, bc_ld = int(args["z_ld"]), int(args["bc_ld"])
    cm = lambda k, cols, ld: (np.asarray(args[k], dtype=np.float64)[_row_index(b, L, cols, ld)]  # noqa: E731
                              .reshape(b, L, cols).transpose(0, 2, 1).ravel())
    channel_major = dict(args, u=cm("u", d, d), delta=cm("delta", d, d), dout=cm("dout", d, d), z=cm("z", d, z_ld),
                         Bm=cm("Bm", n, bc_ld), Cm=cm("Cm", n, bc_ld))
    res = _bwd(channel_major, dims, 8, False)
    tm = lambda v: np.asarray(v).reshape(b, d, L).transpose(0, 2, 1).ravel()  # noqa: E731
    n_dz = (b * L - 1) * z_ld + d
    dz = np.asarray(args["dz"], dtype=np.float64)[:n_dz].copy()
    dz[_row_index(b, L, d, z_ld).ravel()] = tm(res["dz"])
    return dict(res, du=tm(res["du"]), ddelta=tm(res["ddelta"]), dz=dz)


def ssm_reduce_d_BC(args, dims):
    """The reference library's fused reduction: locals [b][t][d][n] summed over d -> dB, dC [b][t][n]."""
    b, L, d, n = dims["batch"], dims["L"], dims["d_inner"], dims["d_state"]
    return {k: np.asarray(args[f"{k}_local"], dtype=np.float64).reshape(b, L, d, n).sum(axis=2).ravel()
            for k in ("dB", "dC")}


def ssm_reduce_d_BC_tmajor(args, dims):
    """The t-major twin: locals [b][n][d][t] summed over d -> dB, dC [b][t][n] (the same layout as above)."""
    b, L, d, n = dims["batch"], dims["L"], dims["d_inner"], dims["d_state"]
    return {k: np.asarray(args[f"{k}_local"], dtype=np.float64).reshape(b, n, d, L).sum(axis=2).transpose(0, 2, 1).ravel()
            for k in ("dB", "dC")}


def ssm_reduce_d_BC_groups(args, dims):
    b, g, n, L = dims["batch"], dims["groups"], dims["d_state"], dims["L"]
    return {"out": np.asarray(args["part"], dtype=np.float64).reshape(b, g, n * L).sum(axis=1).ravel()}


def ssm_reduce_d_BC_groups_tmajor(args, dims):
    b, g, n, L = dims["batch"], dims["groups"], dims["d_state"], dims["L"]
    s = np.asarray(args["part"], dtype=np.float64).reshape(b, g, n, L).sum(axis=1)
    return {"out": s.transpose(0, 2, 1).ravel()}


def ssm_reduce_d_D(args, dims):
    return {"out": np.asarray(args["part"], dtype=np.float64).reshape(dims["batch"], dims["d_inner"]).sum(axis=0)}


def ssm_reduce_d_a_log(args, dims):
    s = np.asarray(args["part"], dtype=np.float64).reshape(dims["batch"], dims["dn"]).sum(axis=0)
    return {"out": -np.exp(np.asarray(args["A_log"], dtype=np.float64)) * s}


def ssm_reduce_d_a_log_chunks(args, dims):
    rows = dims["nchunks"] * dims["batch"]
    s = np.asarray(args["part"], dtype=np.float64).reshape(rows, dims["dn"]).sum(axis=0)
    return {"out": -np.exp(np.asarray(args["A_log"], dtype=np.float64)) * s}
