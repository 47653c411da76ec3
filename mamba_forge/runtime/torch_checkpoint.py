"""mamba-ssm's model configuration and checkpoint files for runtime/torch_model.py: MambaConfig (its fields and
defaults), what of it these layers build (check_config), and the files of a checkpoint folder read under bounds
(config.json at most CONFIG_MAX_BYTES, JSON of MambaConfig's fields; the weights at most what the config's
parameters can take, through torch.load(weights_only=True) or safetensors) and written whole or not at all."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "pytorch_model.bin"
SAFE_WEIGHTS_NAME = "model.safetensors"
CONFIG_MAX_BYTES = 1 << 20  # a mamba-ssm config.json is a few hundred bytes
WEIGHTS_SLACK_BYTES = 16 << 20  # what a checkpoint holds beyond its tensors' bytes (pickle records, names, padding)

HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")  # owner/model

# Mamba's constructor arguments a config's ssm_cfg may set (mamba_simple.Mamba's, which ours takes), each with the
# test its value must pass
_INT, _NUM, _BOOL = ("a positive integer", lambda v: _is_int(v) and v > 0), \
    ("a positive number", lambda v: _is_num(v) and v > 0), ("true or false", lambda v: isinstance(v, bool))
MAMBA_ARGS = {"d_state": _INT, "d_conv": _INT, "expand": _NUM, "dt_min": _NUM, "dt_max": _NUM, "dt_scale": _NUM,
              "dt_init_floor": _NUM, "conv_bias": _BOOL, "bias": _BOOL, "use_fast_path": _BOOL,
              "dt_rank": ('"auto" or a positive integer', lambda v: v == "auto" or (_is_int(v) and v > 0)),
              "dt_init": ('"random" or "constant"', lambda v: v in ("random", "constant"))}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (_is_int(v) or isinstance(v, float)) and v == v and v not in (float("inf"), float("-inf"))


@dataclass
class MambaConfig:
    """mamba_ssm.models.config_mamba.MambaConfig: the same fields and defaults (mamba-2.8b's widths)."""

    d_model: int = 2560
    d_intermediate: int = 0
    n_layer: int = 64
    vocab_size: int = 50277
    ssm_cfg: dict = field(default_factory=dict)
    attn_layer_idx: list = field(default_factory=list)
    attn_cfg: dict = field(default_factory=dict)
    rms_norm: bool = True
    residual_in_fp32: bool = True
    fused_add_norm: bool = True
    pad_vocab_size_multiple: int = 8
    tie_embeddings: bool = True


def _positive_int(name: str, v) -> int:
    if not _is_int(v) or v < 1:
        raise ValueError(f"MambaConfig.{name}={v!r}: a positive integer")
    return v


def check_config(config: MambaConfig) -> None:
    """Refuse, with what to change, a configuration these layers do not build: mamba-ssm builds attention layers,
    Mamba2 and MLPs from other modules, and the qualified block is fused add + RMSNorm with an f32 residual."""
    for name in ("d_model", "n_layer", "vocab_size", "pad_vocab_size_multiple"):
        _positive_int(name, getattr(config, name))
    if config.d_intermediate:
        raise ValueError(f"MambaConfig.d_intermediate={config.d_intermediate!r}: the blocks here have no MLP "
                         "(mamba-ssm's GatedMLP); use 0")
    if config.attn_layer_idx:
        raise ValueError(f"MambaConfig.attn_layer_idx={config.attn_layer_idx!r}: attention layers are not served "
                         "here; use []")
    if not isinstance(config.ssm_cfg, dict):
        raise ValueError(f"MambaConfig.ssm_cfg={config.ssm_cfg!r}: a dict of Mamba's constructor arguments")
    layer = config.ssm_cfg.get("layer", "Mamba1")
    if layer != "Mamba1":
        raise ValueError(f"MambaConfig.ssm_cfg layer={layer!r}: only Mamba1 layers are served here")
    unknown = sorted(set(config.ssm_cfg) - set(MAMBA_ARGS) - {"layer"})
    if unknown:
        raise ValueError(f"MambaConfig.ssm_cfg: {', '.join(unknown)} not Mamba's arguments "
                         f"({', '.join(sorted(MAMBA_ARGS))})")
    for name, v in config.ssm_cfg.items():
        what, ok = MAMBA_ARGS.get(name, (None, None))
        if ok is not None and not ok(v):
            raise ValueError(f"MambaConfig.ssm_cfg {name}={v!r}: {what}")
    for name in ("rms_norm", "fused_add_norm", "residual_in_fp32"):
        if getattr(config, name) is not True:
            raise ValueError(f"MambaConfig.{name}={getattr(config, name)!r}: the qualified block is fused add + "
                             "RMSNorm with a float32 residual; set it to true")


def padded_vocab(config: MambaConfig) -> int:
    """vocab_size rounded up to pad_vocab_size_multiple (mamba-ssm pads the embedding and the head the same way)."""
    m = config.pad_vocab_size_multiple
    return -(-config.vocab_size // m) * m


# ---- checkpoint files ------------------------------------------------------------------------------------------

def few(names) -> str:
    """Up to four names, sorted, and how many more: a refusal's list on one line."""
    names = sorted(names)
    return "none" if not names else ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def key_differences(model: nn.Module, state: dict) -> tuple[set, set]:
    want = set(model.state_dict())
    return want - set(state), set(state) - want


def checkpoint_folder(name) -> Path:
    """A local folder as given, or a Hub name ("owner/model") fetched by huggingface_hub where it is installed."""
    path = Path(name)
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{path}: a checkpoint is a folder (config.json and {WEIGHTS_NAME} or {SAFE_WEIGHTS_NAME})")
    text = str(name)
    if not HUB_NAME.fullmatch(text):
        raise ValueError(f"{text}: no such folder (a checkpoint folder holds config.json and {WEIGHTS_NAME})")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(f"{text}: no such folder; a Hugging Face Hub name needs huggingface_hub "
                         "(pip install huggingface_hub), or pass a local folder with config.json and "
                         f"{WEIGHTS_NAME}") from None
    try:
        return Path(snapshot_download(text, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, SAFE_WEIGHTS_NAME]))
    except Exception as exc:  # noqa: BLE001  no network, no such repository, no access: one line, not a traceback
        raise ValueError(f"{text}: no such folder, and the Hugging Face Hub did not give it "
                         f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None


def load_config(path: Path) -> MambaConfig:
    """config.json as a MambaConfig: at most CONFIG_MAX_BYTES, a JSON object whose keys are MambaConfig's fields
    (a transformers-format config, e.g. a '-hf' repository's, is refused: it names other fields)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(CONFIG_MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the config ({exc.strerror or exc})") from None
    if len(raw) > CONFIG_MAX_BYTES:
        raise ValueError(f"{path}: over {CONFIG_MAX_BYTES} bytes; a mamba-ssm config.json is a few hundred")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON object of MambaConfig's fields")
    fields = {f.name for f in dataclasses.fields(MambaConfig)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ValueError(f"{path}: {few(unknown)} not fields of mamba-ssm's MambaConfig (a transformers-format "
                         "config? take the mamba-ssm checkpoint, e.g. state-spaces/mamba-130m)")
    config = MambaConfig(**data)
    check_config(config)
    return config


def _state_bytes_bound(model: nn.Module) -> int:
    """The most bytes a checkpoint of this model can hold: every tensor of its state dict in float64, plus slack."""
    return sum(t.numel() for t in model.state_dict().values()) * 8 + WEIGHTS_SLACK_BYTES


def load_state_dict(folder: Path, model: nn.Module) -> dict:
    """The checkpoint's tensors on the CPU: model.safetensors where present (with safetensors installed), else
    pytorch_model.bin through torch.load(weights_only=True); either refused past _state_bytes_bound(model)."""
    safe, pickled = folder / SAFE_WEIGHTS_NAME, folder / WEIGHTS_NAME
    path = safe if safe.is_file() else pickled
    if not path.is_file():
        raise ValueError(f"{folder}: neither {WEIGHTS_NAME} nor {SAFE_WEIGHTS_NAME} is there")
    size, bound = path.stat().st_size, _state_bytes_bound(model)
    if size > bound:
        raise ValueError(f"{path}: {size} bytes, more than a checkpoint of this config can hold ({bound}); "
                         "is config.json the checkpoint's?")
    try:
        if path == safe:
            try:
                from safetensors.torch import load_file
            except ImportError:
                raise ValueError(f"{path}: reading it needs safetensors (pip install safetensors)") from None
            state = load_file(str(path), device="cpu")
        else:
            try:  # mapped, not read whole (a 2.8b checkpoint is 11 GB in f32); a pre-zip-format file cannot be
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc):
                    raise
                state = torch.load(path, map_location="cpu", weights_only=True)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001  an unpickling refusal, a truncated file, a format error: one line
        raise ValueError(f"{path}: not a checkpoint these loaders read ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:300]})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()):
        raise ValueError(f"{path}: not a state dict (names to tensors)")
    return state


def write_atomic(path: Path, write) -> None:
    """write(f) into a temporary file beside path, synced, then renamed over it: path is the old file or the whole
    new one, never part of one; the temporary file is removed on any failure."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


__all__ = ["CONFIG_NAME", "MAMBA_ARGS", "MambaConfig", "SAFE_WEIGHTS_NAME", "WEIGHTS_NAME", "check_config",
           "checkpoint_folder", "few", "key_differences", "load_config", "load_state_dict", "padded_vocab", "write_atomic"]
