"""Where ranks run: CPU cores or CUDA GPUs, which transport joins them, and layouts that cannot run.

The device type comes from the caller (`LaunchOptions.device`, `ProfileOptions.device`), else the
environment variable GPIPE_EXEC_DEVICE (cpu | cuda | auto), else auto: CUDA where torch sees a GPU.
NCCL refuses two ranks on one GPU, so a layout with several stages on one GPU runs over gloo, each
transfer staged through host memory (`Transport.staged`), as the simulator's shared device models
it; ranks on distinct GPUs use NCCL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch

from gpipe_exec.launch.device_choice import DEFAULT_DEVICE, DEVICE_ENV, DEVICE_TYPES
from gpipe_exec.runtime.comm import stages_through_host
from gpipe_sim.errors import ScenarioError


def device_type(requested: str | None = None) -> str:
    """"cpu" or "cuda": `requested` (or $GPIPE_EXEC_DEVICE, or "auto") resolved on this machine.
    ScenarioError (one line) for an unknown name or CUDA asked where torch sees no GPU."""
    name = (requested or os.environ.get(DEVICE_ENV) or DEFAULT_DEVICE).strip().lower()
    if name.startswith("cuda"):
        name = "cuda"
    if name not in DEVICE_TYPES:
        raise ScenarioError(f"device: {name!r} is not one of {', '.join(DEVICE_TYPES)} (from {DEVICE_ENV} "
                            "or the command's --device)")
    if name == DEFAULT_DEVICE:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ScenarioError("device: cuda asked for, but torch sees no CUDA GPU here (a CPU build of torch, "
                            "or no driver); run on cpu")
    return name


@dataclass(frozen=True)
class Transport:
    """How the ranks exchange tensors: the torch.distributed backend, and whether each transfer is
    staged through host memory (gloo joining ranks that share a GPU: it moves no CUDA tensors)."""

    backend: str
    staged: bool = False


def transport(kind: str, device_map: Sequence[int], backend: str | None = None) -> Transport:
    """The transport for ranks on `device_map` of devices of `kind` ("cpu" or "cuda"): gloo on CPU;
    on CUDA NCCL, or gloo with host staging where two ranks share a GPU (NCCL refuses that) or
    `backend` asks for gloo."""
    if kind != "cuda":
        return Transport(backend or "gloo")
    shared = len(set(device_map)) < len(device_map)
    chosen = backend or ("gloo" if shared else "nccl")
    if chosen == "nccl" and shared:
        raise ScenarioError("hardware.stage_to_device: NCCL refuses two ranks on one GPU; leave the backend "
                            "to gpipe-exec (it joins such ranks over gloo) or give each stage its own GPU")
    return Transport(chosen, staged=stages_through_host("cuda", chosen))



def check_gpu_layout(device_map: Sequence[int], gpus: int) -> None:
    """ScenarioError (one line) where a rank is placed on a GPU this machine does not have."""
    missing = sorted({d for d in device_map if d >= gpus})
    if missing:
        raise ScenarioError(
            f"hardware.stage_to_device: the layout uses GPU {missing[0]} but this machine has {gpus} "
            f"GPU{'s' if gpus != 1 else ''} (0..{gpus - 1}); place the stages on those (several stages may "
            "share one GPU) or run under torchrun across machines")


def configure_cuda_math() -> None:
    """The executor's and profiler's fp32 on CUDA: full fp32, TF32 off for matmuls and convolutions
    (torch's matmul default; cuDNN's default is on), as the presets' fp32 peak assumes."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
