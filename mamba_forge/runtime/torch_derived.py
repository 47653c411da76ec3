"""Tensors derived from parameters (a transposed weight, a float32 copy), kept while their source is unchanged: the
torch layer's and model's decode path launches no cast or transpose per call (mamba_forge/runtime/torch_layer.py,
torch_model.py)."""

from __future__ import annotations

import torch


class DerivedTensors:
    """Tensors made from a parameter (a transpose, a float32 copy), each remade when its source's storage, version,
    dtype, device or shape moved: an optimizer step (torch's, or this package's AdamW, which counts its writes),
    load_state_dict or a replaced parameter; the modules clear them on .to() / .cpu() / .half() (nn.Module._apply).
    A write torch does not count (through .data, or a replayed CUDA graph) needs clear(): the modules' prepare(
    refresh=True). Made under no_grad from the detached source (what autograd differentiates is the parameter
    itself, on its own path)."""

    __slots__ = ("_got",)

    def __init__(self) -> None:
        self._got: dict[str, tuple[tuple, torch.Tensor]] = {}

    def get(self, name: str, src: torch.Tensor, make) -> torch.Tensor:
        key = (src.data_ptr(), src._version, src.dtype, src.device, tuple(src.shape))
        got = self._got.get(name)
        if got is None or got[0] != key:
            if src.device.type == "cuda" and _capturing(src.device):
                # made inside a capture, the tensor would hold its values only once the graph replays
                raise RuntimeError(f"{name} of a changed or new parameter would be made inside a CUDA-graph capture: "
                                   "call the module's prepare() (or run it once eagerly) before capturing")
            with torch.no_grad():
                got = (key, make(src.detach()))
            self._got[name] = got
        return got[1]

    def clear(self) -> None:
        """Forget every derived tensor (their memory goes with them); the next get() makes each again."""
        self._got.clear()


def _capturing(device: torch.device) -> bool:
    """Whether the current stream of the source's device is capturing (the current device may be another one)."""
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


__all__ = ["DerivedTensors"]
