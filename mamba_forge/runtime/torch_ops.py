"""The torch custom-op table (mamba_forge/runtime/torch.py registers it): each op's schema, which family and dtype
serve a given input, and the output shapes, in plain Python so it is checked without torch. dtypes are the
catalog's tokens (f32, bf16, f16). Standard library only.
"""

from __future__ import annotations

from mamba_forge.core.vocab import LAYOUTS
from mamba_forge.runtime.errors import LaunchRefused
from mamba_forge.runtime.gemm import gemm_dims

LIBRARY = "mamba_forge"

# op name -> torch.library schema; every op allocates its outputs and launches on torch's current stream
SCHEMAS = {
    "softplus_forward": "softplus_forward(Tensor x) -> Tensor",
    "rms_norm": "rms_norm(Tensor x, Tensor weight, float eps, ScalarType? out_dtype=None) -> (Tensor, Tensor)",
    # out = silu(causal depthwise conv1d(x) + bias): x [batch, d, L], weight [d, width], bias [d] (f32)
    "causal_conv1d": "causal_conv1d(Tensor x, Tensor weight, Tensor bias) -> Tensor",
    # the Mamba-1 selective scan forward with delta_softplus, D and z; returns (out [batch, d, L], last_state f32)
    "selective_scan": ("selective_scan(Tensor u, Tensor delta, Tensor A_log, Tensor B, Tensor C, Tensor D, Tensor z, "
                       "Tensor delta_bias) -> (Tensor, Tensor)"),
    # C = op(A) op(B) (+ bias) through the route table's rung (Kernels.gemm): C in A's dtype, [M, N] for the layout
    "gemm": "gemm(Tensor A, Tensor B, Tensor? bias=None, str layout='nn') -> Tensor",
    # the Mamba layer's token-major kernels (kernels/fixed/tokens.toml): prefill and decode (L = 1) alike, carrying
    # their states in place, so any split of a sequence into calls gives the same bits.
    # out [b, L, d] = silu(causal conv of xz[..., :d] from conv_state [b, d, width-1]); conv_state updated
    "conv_tokens": "conv_tokens(Tensor xz, Tensor weight, Tensor bias, Tensor(a!) conv_state) -> Tensor",
    # out [b, L, d]: the selective scan from state [b, d, n] f32 (updated): u, dt [b, L, d], x_dbl [b, L, r+2n]
    # (B, C at columns r..), xz [b, L, 2d] (z = xz[..., d:]), dt' = softplus(dt + dt_bias)
    "scan_tokens": ("scan_tokens(Tensor u, Tensor dt, Tensor dt_bias, Tensor A_log, Tensor x_dbl, Tensor D, "
                    "Tensor xz, Tensor(a!) state) -> Tensor"),
    # y = rms_norm(residual + x) * weight in x's dtype; residual (f32) becomes residual + x (a Mamba Block's add+norm)
    "rms_norm_add": "rms_norm_add(Tensor x, Tensor(a!) residual, Tensor weight, float eps) -> Tensor",
}

# The training ops (mamba_forge/runtime/torch_autograd.py, torch_train.py): the backward ops the forward ops'
# autograd formulas call (register_autograd), and the functional forms of the ops that mutate their arguments.
TRAIN_SCHEMAS = {
    "softplus_backward": "softplus_backward(Tensor dy, Tensor x) -> Tensor",
    # (dx f32 [..., dim], dweight f32 [dim]) of rms_norm's y (x f32; dy in y's dtype)
    "rms_norm_backward": "rms_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor rstd) -> (Tensor, Tensor)",
    # rms_norm_add without mutation: (y in x's dtype, residual + x (f32, a new tensor), rstd)
    "rms_norm_residual": ("rms_norm_residual(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor, "
                          "Tensor)"),
    # (dx in dy's dtype, dresidual f32, dweight f32) from dy, the gradient of the residual output, the forward's
    # residual output and rstd
    "rms_norm_residual_backward": ("rms_norm_residual_backward(Tensor dy, Tensor dresidual, Tensor residual, "
                                   "Tensor weight, Tensor rstd) -> (Tensor, Tensor, Tensor)"),
    # (dx in x's dtype, dweight f32 [d, width], dbias f32 [d]) of causal_conv1d
    "causal_conv1d_backward": ("causal_conv1d_backward(Tensor dout, Tensor x, Tensor weight, Tensor bias) -> (Tensor, "
                               "Tensor, Tensor)"),
    # (du, ddelta, dA_log f32, dB, dC, dD f32, dz, ddelta_bias f32) of selective_scan's out
    "selective_scan_backward": ("selective_scan_backward(Tensor dout, Tensor u, Tensor delta, Tensor A_log, Tensor B, "
                                "Tensor C, Tensor D, Tensor z, Tensor delta_bias) -> (Tensor, Tensor, Tensor, Tensor, "
                                "Tensor, Tensor, Tensor, Tensor)"),
    # db [cols] = column sums of dy [rows, cols] in f32 in a fixed order (gemm's bias gradient), cast to out_dtype
    "reduce_bias": "reduce_bias(Tensor dy, ScalarType? out_dtype=None) -> Tensor",
    # the Mamba layer's training forward from its parameters (the inference forward's kernels, from zero states):
    # (out, then what its backward reads: xz, x, x_dbl, dt, y, saved states [b, d_inner, ceil(L/256), d_state])
    "mamba_mixer": ("mamba_mixer(Tensor hidden, Tensor in_w, Tensor? in_b, Tensor conv_w, Tensor? conv_b, Tensor x_w, "
                    "Tensor dt_w, Tensor dt_b, Tensor A_log, Tensor D, Tensor out_w, Tensor? out_b) -> (Tensor, Tensor, "
                    "Tensor, Tensor, Tensor, Tensor, Tensor)"),
    # the gradients of (hidden, in_w, in_b, conv_w, conv_b, x_w, dt_w, dt_b, A_log, D, out_w, out_b), each in its
    # parameter's dtype and shape ([0] for a bias the layer does not have)
    "mamba_mixer_backward": ("mamba_mixer_backward(Tensor dout, Tensor hidden, Tensor in_w, Tensor conv_w, "
                             "Tensor? conv_b, Tensor x_w, Tensor dt_w, Tensor dt_b, Tensor A_log, Tensor D, Tensor out_w, "
                             "Tensor xz, Tensor x, Tensor x_dbl, Tensor dt, Tensor y, Tensor saved, bool in_bias, "
                             "bool out_bias) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, "
                             "Tensor, Tensor, Tensor)"),
}

SOFTPLUS_DTYPES = ("f32", "bf16", "f16")
SEQUENCE_DTYPES = ("f32", "bf16", "f16")  # the conv1d and scan ops' activation dtypes (weights and states: f32)
CONV1D_FAMILY = "conv1d_burnin_forward_nosave_tiled"  # kernels/fixed/conv1d.toml
SCAN_FAMILY = "ssm_parallel_scan_fwd_nosave"  # kernels/fixed/scan.toml
CONV_TOKENS_FAMILY = "conv1d_tokens_silu"  # kernels/fixed/tokens.toml
SCAN_TOKENS_FAMILY = "ssm_scan_tokens"
# scan_tokens at L = 1 (a decode step) runs the production decode step instead: the same per-element arithmetic
# (mf/tokens.cuh reproduces mf/decode.cuh at LANES = 2; equal bit for bit, tests/gpu/test_mamba_layer_gpu.py and
# tests/test_tokens_emulated.py), at 2 lanes x 64-thread blocks sized for one token rather than 16-step tiles
SCAN_STEP_FAMILY = "ssm_step_forward_fused"  # kernels/fixed/scan.toml
# the decode step on a 16-bit state (scan_tokens with state in the activations' dtype, as mamba-ssm's cache keeps it
# by default): half the state bytes of the f32 step; optional (a manifest without it refuses such a state)
SCAN_STEP_STATE16_FAMILY = "ssm_step_forward_fused_state16"
STATE16_DTYPES = ("bf16", "f16")
# scan_tokens on a small grid (batch x d_inner / 16 blocks within SCAN_TOKENS_WS_WAVES of the GPU's resident blocks,
# d_state <= 16) runs the warp-specialised scan instead: the same bits (mf/tokens.cuh; the emulation and GPU tests
# prove it), so which one serves a call changes nothing but the time. Optional: a manifest without it serves every
# call from SCAN_TOKENS_FAMILY.
SCAN_TOKENS_WS_FAMILY = "ssm_scan_tokens_ws"
SCAN_TOKENS_WS_MAX_STATE = 16
SCAN_TOKENS_WS_BLOCKS_PER_SM = 1  # its instance's launch bounds (tokens.toml MINB; tests/test_torch_layer.py checks)
# measured on the H200 (bf16, L 2048, the four-lane scan with raw loads): ahead at 128 blocks (B1 D2048: 119 against
# 195 us), behind from 256 (B2 D2048 224 against 203, B1 D4096 225 against 204): up to one wave
SCAN_TOKENS_WS_WAVES = 1
# conv_tokens over a few timesteps (a decode step: L = 1) on a large grid runs the vectorised conv instead: four
# channels a thread, vector loads, the same bits (mf/tokens.cuh conv1d_tokens_vec; the emulation and GPU tests prove
# it). The tiled conv's 32-timestep tile holds 96 registers for one output a thread, so a large decode grid takes
# several waves. Measured on the H200 (benchmarks/bench_conv_tokens.py, bf16, L 1, tiled / vectorised): d_inner 2048
# at batch 1, 4, 16, 64, 256: 1.92 / 2.37, 2.17 / 2.41, 2.55 / 2.50, 4.23 / 2.93, 11.14 / 5.28 us; d_inner 5120 at
# batch 4 and 16: 2.45 / 2.49 and 2.94 / 2.82 us. So it serves from CONV_TOKENS_VEC_MIN_BLOCKS_PER_SM blocks of the
# tiled conv (128 channels x one batch row each) per SM. Optional, like SCAN_TOKENS_WS_FAMILY.
CONV_TOKENS_VEC_FAMILY = "conv1d_tokens_silu_vec"
CONV_TOKENS_VEC_MAX_L = 4  # a thread walks L itself: beyond a few timesteps the tiled conv's parallelism wins
CONV_TOKENS_VEC_MIN_BLOCKS_PER_SM = 2
CONV_TOKENS_BLOCK_CHANNELS = 128  # channels a block of the tiled conv takes (tokens.toml: grid ceil_div(d, 128))
RMS_NORM_ADD_FAMILY = "rmsnorm_forward_resadd_f32in"  # kernels/fixed/norm.toml
RMS_NORM_KERNELS = {  # (x dtype, out dtype) -> (family, dtype): kernels/fixed/norm.toml
    ("f32", "f32"): ("rmsnorm_forward", "f32"),
    ("f32", "bf16"): ("rmsnorm_forward_f32in", "bf16"),  # the residual stream stays f32, the output is half
    ("f32", "f16"): ("rmsnorm_forward_f32in", "f16"),
}


# ---- the backward kernels (kernels/fixed/*.toml), resolved at the first backward that needs them --------------
SCAN_SAVE_CHUNK = 256  # timesteps between the scan's saved states (kernels: mf::kScanSaveChunk)
SCAN_SAVE_FAMILY = "ssm_parallel_scan_fwd"  # selective_scan's backward replays it for the saved states
SCAN_TOKENS_SAVE_FAMILY = "ssm_scan_tokens_save"  # mamba_mixer's training forward: ssm_scan_tokens with the saves
# channel group W -> backward family: the fold (W = 8) is the measured one (fwd+bwd 1.08x and 1.13x mamba-ssm's,
# the plain W = 4 1.35x and 1.42x: benchmarks/results/README.md); the plain one serves d_inner % 8 != 0
SCAN_BWD_FAMILIES = {8: "ssm_parallel_scan_bwd_fold", 4: "ssm_parallel_scan_bwd"}
# mamba_mixer's scan backward where it serves (d_inner % 8 == 0, d_state <= 16: every Mamba-1 model): the fold on
# the token-major operands the forward left, so the backward transposes none of them (9 of its 12 layout changes,
# about 0.75 ms of a 5.8 ms d_model 1024 (b8, L2048) step); the channel-major families serve the other shapes
SCAN_BWD_TOKENS_FAMILY = "ssm_parallel_scan_bwd_fold_tokens"
SCAN_BWD_TOKENS_MAX_STATE = 16  # the B, C span it stages (mf::kFoldTokState)
CONV_SAVE_FAMILY = "conv1d_burnin_forward_tiled"  # writes pre = conv + bias, which the backward reads
CONV_BWD_FAMILY = "conv1d_bwd_tiled"
RMS_NORM_BWD_KERNELS = {  # dy dtype -> (family, dtype); x is the f32 residual stream in every case
    "f32": ("rmsnorm_backward", "f32"), "bf16": ("rmsnorm_backward_f32in", "bf16"),
    "f16": ("rmsnorm_backward_f32in", "f16"),
}
REDUCE = {  # the fixed-order reductions that fold partials into weight gradients (no atomics anywhere)
    "rows": ("reduce_sum_axis0", "f32"), "dA_log": ("ssm_reduce_d_a_log", ""), "batch": ("ssm_reduce_d_D", ""),
    "add_f32": ("vec_add_inplace", "f32"),
}


def scan_bwd_family(op: str, d_inner: int) -> tuple[str, int]:
    """(family, channel group W) of the scan backward for d_inner channels; the kernels' grid covers d_inner // W
    groups, so a d_inner that is no multiple of 4 is refused here (the launch contract cannot see it)."""
    for w, family in SCAN_BWD_FAMILIES.items():
        if d_inner % w == 0:
            return family, w
    raise LaunchRefused(f"mamba_forge::{op}: the scan backward kernels take d_inner in multiples of 4 (the fold 8); "
                        f"d_inner is {d_inner}")


def mixer_scan_bwd_family(d_inner: int, d_state: int) -> tuple[str, int, bool]:
    """(family, channel group W, token-major) of mamba_mixer's scan backward."""
    if d_inner % 8 == 0 and d_state <= SCAN_BWD_TOKENS_MAX_STATE:
        return SCAN_BWD_TOKENS_FAMILY, 8, True
    family, w = scan_bwd_family("mamba_mixer", d_inner)
    return family, w, False


def rms_norm_bwd_kernel(dy_dtype: str) -> tuple[str, str]:
    got = RMS_NORM_BWD_KERNELS.get(dy_dtype)
    if got is None:
        raise LaunchRefused(f"mamba_forge::rms_norm backward: dy is {dy_dtype}; it takes "
                            f"{', '.join(RMS_NORM_BWD_KERNELS)}")
    return got


def mixer_shapes(hidden: tuple[int, ...], in_w: tuple[int, ...], conv_w: tuple[int, ...], x_w: tuple[int, ...],
                 dt_w: tuple[int, ...], dt_b: tuple[int, ...], A_log: tuple[int, ...], D: tuple[int, ...],
                 out_w: tuple[int, ...]) -> tuple[int, int, int, int, int, int, int]:
    """(batch, L, d_model, d_inner, width, dt_rank, d_state) of mamba_mixer's operands, mamba-ssm's parameter
    shapes: hidden [b, L, d_model], in_w [2*d_inner, d_model], conv_w [d_inner, 1, width], x_w
    [dt_rank + 2*d_state, d_inner], dt_w [d_inner, dt_rank], dt_b, D [d_inner], A_log [d_inner, d_state],
    out_w [d_model, d_inner]."""
    if len(hidden) != 3 or len(in_w) != 2 or len(conv_w) != 3 or len(A_log) != 2 or len(dt_w) != 2:
        raise LaunchRefused(f"mamba_forge::mamba_mixer: hidden {list(hidden)} must be [batch, L, d_model], in_w "
                            f"{list(in_w)} [2*d_inner, d_model], conv_w {list(conv_w)} [d_inner, 1, width], A_log "
                            f"{list(A_log)} [d_inner, d_state], dt_w {list(dt_w)} [d_inner, dt_rank]")
    batch, length, dm = hidden
    d, n, r, width = A_log[0], A_log[1], dt_w[1], conv_w[2]
    got = {"hidden": hidden, "in_w": in_w, "conv_w": conv_w, "x_w": x_w, "dt_w": dt_w, "dt_b": dt_b, "A_log": A_log,
           "D": D, "out_w": out_w}
    _shape_problem("mamba_mixer", got, {"in_w": (2 * d, dm), "conv_w": (d, 1, width), "x_w": (r + 2 * n, d),
                                        "dt_w": (d, r), "dt_b": (d,), "D": (d,), "out_w": (dm, d)})
    if not 2 <= width <= 4:
        raise LaunchRefused(f"mamba_forge::mamba_mixer: conv width {width}; the kernels take 2..4")
    return batch, length, dm, d, width, r, n


def mixer_backward_kernels(dtype: str, d_inner: int, d_state: int) -> list[tuple[str, str]]:
    """Every (family, dtype) mamba_mixer's training launches besides the inference kernels and the GEMMs: the saving
    scan and the backward's (Mamba.check_training_kernels)."""
    return [(SCAN_TOKENS_SAVE_FAMILY, dtype), (CONV_SAVE_FAMILY, dtype), (CONV_BWD_FAMILY, dtype),
            (mixer_scan_bwd_family(d_inner, d_state)[0], dtype),
            ("ssm_reduce_d_BC_groups_tmajor", dtype), REDUCE["dA_log"], REDUCE["batch"], ("residual_add", dtype),
            ("transpose_rows", dtype),
            ("reduce_bias", dtype)]


def norm_backward_kernels(dtype: str) -> list[tuple[str, str]]:
    """What rms_norm_residual's backward launches (Block.check_training_kernels)."""
    return [rms_norm_bwd_kernel(dtype), REDUCE["rows"], REDUCE["add_f32"]]


def softplus_kernel(x_dtype: str) -> tuple[str, str]:
    if x_dtype not in SOFTPLUS_DTYPES:
        raise LaunchRefused(f"mamba_forge::softplus_forward: x is {x_dtype}; it takes {', '.join(SOFTPLUS_DTYPES)}")
    return "softplus_forward", x_dtype


def rms_norm_kernel(x_dtype: str, out_dtype: str) -> tuple[str, str]:
    got = RMS_NORM_KERNELS.get((x_dtype, out_dtype))
    if got is None:
        have = ", ".join(f"x {a} -> {b}" for a, b in RMS_NORM_KERNELS)
        raise LaunchRefused(f"mamba_forge::rms_norm: no kernel for x {x_dtype} -> {out_dtype} (has {have})")
    return got


def rms_norm_shapes(x_shape: tuple[int, ...], weight_shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, dim) of x [..., dim] normalised over its last dimension by a weight of shape [dim]."""
    if not x_shape or len(weight_shape) != 1 or x_shape[-1] != weight_shape[0] or not x_shape[-1]:
        raise LaunchRefused(f"mamba_forge::rms_norm: x {list(x_shape)} and weight {list(weight_shape)} do not fit: "
                            "x is [..., dim], weight is [dim], dim >= 1")
    rows = 1
    for n in x_shape[:-1]:
        rows *= n
    return rows, x_shape[-1]


def sequence_kernel(op: str, family: str, dtype: str) -> tuple[str, str]:
    if dtype not in SEQUENCE_DTYPES:
        raise LaunchRefused(f"mamba_forge::{op}: activations are {dtype}; it takes {', '.join(SEQUENCE_DTYPES)}")
    return family, dtype


def _shape_problem(op: str, got: dict[str, tuple[int, ...]], want: dict[str, tuple[int, ...]]) -> None:
    for name, shape in want.items():
        if tuple(got[name]) != shape:
            raise LaunchRefused(f"mamba_forge::{op}: {name} is {list(got[name])}, expected {list(shape)} "
                                f"(from {', '.join(f'{k} {list(v)}' for k, v in got.items() if k != name)})")


def conv1d_shapes(x: tuple[int, ...], weight: tuple[int, ...], bias: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(batch, d, L, width) of x [batch, d, L], weight [d, width], bias [d]."""
    if len(x) != 3 or len(weight) != 2:
        raise LaunchRefused(f"mamba_forge::causal_conv1d: x {list(x)} must be [batch, d, L] and weight "
                            f"{list(weight)} [d, width]")
    batch, d, length = x
    if not 1 <= weight[1] <= 4:  # the kernels' widths (another writes nothing)
        raise LaunchRefused(f"mamba_forge::causal_conv1d: width {weight[1]}; the kernels take 1..4")
    _shape_problem("causal_conv1d", {"x": x, "weight": weight, "bias": bias}, {"weight": (d, weight[1]), "bias": (d,)})
    return batch, d, length, weight[1]


def same_shapes(op: str, pairs: dict) -> None:
    """A backward op's incoming gradients against the tensors they are the gradients of: {name: (got, want)}
    shapes (a transposed or larger gradient would be read in the other's layout)."""
    for name, (got, want) in pairs.items():
        if tuple(got) != tuple(want):
            raise LaunchRefused(f"mamba_forge::{op}: {name} is {list(got)}, expected {list(want)}")


def scan_shapes(u: tuple[int, ...], delta: tuple[int, ...], A_log: tuple[int, ...], B: tuple[int, ...],
                C: tuple[int, ...], D: tuple[int, ...], z: tuple[int, ...],
                delta_bias: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(batch, d_inner, d_state, L) of u, delta, z [batch, d_inner, L], A_log [d_inner, d_state],
    B, C [batch, d_state, L], D, delta_bias [d_inner]."""
    if len(u) != 3 or len(A_log) != 2:
        raise LaunchRefused(f"mamba_forge::selective_scan: u {list(u)} must be [batch, d_inner, L] and A_log "
                            f"{list(A_log)} [d_inner, d_state]")
    batch, d, length = u
    n = A_log[1]
    got = {"u": u, "delta": delta, "A_log": A_log, "B": B, "C": C, "D": D, "z": z, "delta_bias": delta_bias}
    _shape_problem("selective_scan", got, {"delta": u, "z": u, "A_log": (d, n), "B": (batch, n, length),
                                           "C": (batch, n, length), "D": (d,), "delta_bias": (d,)})
    return batch, d, n, length


def conv_tokens_shapes(xz: tuple[int, ...], weight: tuple[int, ...], bias: tuple[int, ...],
                       conv_state: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(batch, d, L, width) of xz [batch, L, 2d], weight [d, width] (width 2..4), bias [d], conv_state
    [batch, d, width-1]."""
    if len(xz) != 3 or xz[2] % 2 or len(weight) != 2:
        raise LaunchRefused(f"mamba_forge::conv_tokens: xz {list(xz)} must be [batch, L, 2*d] and weight "
                            f"{list(weight)} [d, width]")
    batch, length, d = xz[0], xz[1], xz[2] // 2
    width = weight[1]
    if not 2 <= width <= 4:
        raise LaunchRefused(f"mamba_forge::conv_tokens: width {width}; the kernels take 2..4")
    _shape_problem("conv_tokens", {"xz": xz, "weight": weight, "bias": bias, "conv_state": conv_state},
                   {"weight": (d, width), "bias": (d,), "conv_state": (batch, d, width - 1)})
    return batch, d, length, width


def scan_tokens_shapes(u: tuple[int, ...], dt: tuple[int, ...], dt_bias: tuple[int, ...], A_log: tuple[int, ...],
                       x_dbl: tuple[int, ...], D: tuple[int, ...], xz: tuple[int, ...],
                       state: tuple[int, ...]) -> tuple[int, int, int, int, int]:
    """(batch, L, d_inner, d_state, dt_rank) of u, dt [batch, L, d], A_log [d, n], x_dbl [batch, L, r + 2n],
    D, dt_bias [d], xz [batch, L, 2d], state [batch, d, n]."""
    if len(u) != 3 or len(A_log) != 2 or len(x_dbl) != 3:
        raise LaunchRefused(f"mamba_forge::scan_tokens: u {list(u)} must be [batch, L, d_inner], A_log "
                            f"{list(A_log)} [d_inner, d_state], x_dbl {list(x_dbl)} [batch, L, dt_rank + 2*d_state]")
    batch, length, d = u
    n = A_log[1]
    r = x_dbl[2] - 2 * n
    if r < 0:
        raise LaunchRefused(f"mamba_forge::scan_tokens: x_dbl has {x_dbl[2]} columns, fewer than 2*d_state = {2 * n}")
    got = {"u": u, "dt": dt, "dt_bias": dt_bias, "A_log": A_log, "x_dbl": x_dbl, "D": D, "xz": xz, "state": state}
    _shape_problem("scan_tokens", got, {"dt": u, "dt_bias": (d,), "A_log": (d, n), "x_dbl": (batch, length, r + 2 * n),
                                        "D": (d,), "xz": (batch, length, 2 * d), "state": (batch, d, n)})
    return batch, length, d, n, r


def gemm_shape(layout: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int]:
    """(M, N) of mamba_forge::gemm's output for A and B stored as `layout` says (runtime/gemm.gemm_dims)."""
    if layout not in LAYOUTS:
        raise LaunchRefused(f"mamba_forge::gemm: layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    if len(a) != 2 or len(b) != 2:
        raise LaunchRefused(f"mamba_forge::gemm: A {list(a)} and B {list(b)} must be 2-D matrices")
    m, n, _ = gemm_dims(layout, (a[0], a[1]), (b[0], b[1]))
    return m, n


def serving_gemm_rungs(kernels) -> list[str]:
    """Every auto rung of the loaded manifest's route table that serves on this device, in table order: what
    mamba_forge::gemm may launch, loaded by register() so a capture loads no module."""
    out: list[str] = []
    for route in getattr(kernels.manifest, "routes", None) or ():
        for rung in route.rungs:
            if rung.mode == "auto" and rung.symbol not in out and kernels._serves_name(rung.symbol):
                out.append(rung.symbol)
    return out


def scan_tokens_ws_serves(batch: int, d_inner: int, d_state: int, sm_count: int) -> bool:
    """Whether scan_tokens at these sizes runs the warp-specialised scan: d_state within its registers and its
    grid (16 channels x one batch row a block) within SCAN_TOKENS_WS_WAVES waves of resident blocks."""
    blocks = -(-d_inner // 16) * batch
    return d_state <= SCAN_TOKENS_WS_MAX_STATE and blocks <= SCAN_TOKENS_WS_WAVES * SCAN_TOKENS_WS_BLOCKS_PER_SM * sm_count


def conv_tokens_vec_serves(batch: int, d: int, length: int, sm_count: int) -> bool:
    """Whether conv_tokens at these sizes runs the vectorised conv (CONV_TOKENS_VEC_FAMILY): a few timesteps, and a
    grid of the tiled conv of at least CONV_TOKENS_VEC_MIN_BLOCKS_PER_SM blocks an SM."""
    blocks = -(-d // CONV_TOKENS_BLOCK_CHANNELS) * batch
    return 1 <= length <= CONV_TOKENS_VEC_MAX_L and sm_count > 0 and blocks >= CONV_TOKENS_VEC_MIN_BLOCKS_PER_SM * sm_count


OPTIONAL_SEQUENCE_FAMILIES = (SCAN_TOKENS_WS_FAMILY, CONV_TOKENS_VEC_FAMILY)  # absent: the plain family serves


def kernels_used() -> list[tuple[str, str]]:
    """Every (family, dtype) an op may launch: loaded at registration, so a CUDA-graph capture loads no module."""
    return ([softplus_kernel(d) for d in SOFTPLUS_DTYPES] + list(RMS_NORM_KERNELS.values())
            + [(CONV1D_FAMILY, d) for d in SEQUENCE_DTYPES] + [(SCAN_FAMILY, d) for d in SEQUENCE_DTYPES]
            + [(f, d) for f in (CONV_TOKENS_FAMILY, SCAN_TOKENS_FAMILY, SCAN_STEP_FAMILY, RMS_NORM_ADD_FAMILY)
               for d in SEQUENCE_DTYPES])


__all__ = ["CONV1D_FAMILY", "CONV_BWD_FAMILY", "CONV_SAVE_FAMILY", "CONV_TOKENS_FAMILY", "LIBRARY", "REDUCE",
           "RMS_NORM_ADD_FAMILY", "RMS_NORM_BWD_KERNELS", "SCAN_BWD_FAMILIES", "SCAN_BWD_TOKENS_FAMILY",
           "SCAN_BWD_TOKENS_MAX_STATE", "SCAN_SAVE_CHUNK", "SCAN_SAVE_FAMILY", "SCAN_TOKENS_SAVE_FAMILY",
           "SCAN_STEP_FAMILY", "SCAN_STEP_STATE16_FAMILY", "STATE16_DTYPES", "SCAN_TOKENS_FAMILY", "SCAN_TOKENS_WS_FAMILY", "scan_tokens_ws_serves",
           "CONV_TOKENS_VEC_FAMILY", "CONV_TOKENS_VEC_MAX_L", "CONV_TOKENS_VEC_MIN_BLOCKS_PER_SM",
           "CONV_TOKENS_BLOCK_CHANNELS", "conv_tokens_vec_serves", "OPTIONAL_SEQUENCE_FAMILIES", "TRAIN_SCHEMAS",
           "mixer_backward_kernels", "mixer_scan_bwd_family", "mixer_shapes", "norm_backward_kernels",
           "rms_norm_bwd_kernel", "scan_bwd_family",
           "conv_tokens_shapes", "scan_tokens_shapes", "RMS_NORM_KERNELS", "SCAN_FAMILY", "SCHEMAS", "SEQUENCE_DTYPES",
           "SOFTPLUS_DTYPES", "conv1d_shapes", "gemm_shape", "kernels_used", "rms_norm_kernel", "rms_norm_shapes", "scan_shapes",
           "sequence_kernel", "serving_gemm_rungs", "softplus_kernel"]
