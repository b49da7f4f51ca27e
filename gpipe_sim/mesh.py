"""The parallel mesh's derived sizes: devices per pipeline rank, the gradient-reduction group, ring members."""

from __future__ import annotations

from typing import Any

# Megatron-LM's default rank order (--rank-order "tp-cp-ep-dp-pp"): tensor-parallel ranks innermost,
# then context-parallel, then data-parallel, then pipeline. A pipeline rank of one replica therefore
# occupies T x C consecutive devices; its tensor-parallel groups are T consecutive ones and its
# context-parallel groups every T-th of them.


def devices_per_rank(pipeline: Any) -> int:
    """T x C: the devices one pipeline rank of one replica runs on."""
    return pipeline.tensor_parallel * pipeline.context_parallel


def gradient_group(pipeline: Any) -> int:
    """D x C: the devices each weight's gradient is reduced over (Megatron-LM reduces over the
    data-parallel group with context parallelism, DP x CP: every context-parallel rank holds the
    same weights and computes their gradient on its part of the sequence)."""
    return pipeline.data_parallel * pipeline.context_parallel


def expert_gradient_group(pipeline: Any) -> int:
    """D x C / E: the devices holding the same routed experts, over which their gradients are
    reduced (Megatron-LM's expert-data-parallel group)."""
    return gradient_group(pipeline) // pipeline.expert_parallel


def whole_layers(pipeline: Any) -> bool:
    """Whether one device's layer table is the whole model's (no T, C or E split: T x C x E = 1)."""
    return devices_per_rank(pipeline) * pipeline.expert_parallel == 1


def context_members(first_device: int, tp: int, cp: int) -> list[int]:
    """The C devices of the context-parallel group of the tensor rank at `first_device` (its
    group's first device): every T-th device from it."""
    return [first_device + c * tp for c in range(cp)]


def rank_layout_problem(hardware: Any, width: int, field: str, count: str, what: str, fix: str = "") -> str | None:
    """Why ranks `width` devices wide (`count` of them, as the fields give it; `what`, the fields
    with their values) cannot be laid out on `hardware`, in one line naming the field, or None:
    they must tile its nodes (divide a node's devices or be whole nodes; `field` is named, `fix`
    appended) and each must start on a multiple of `width` (a rank takes `width` consecutive
    devices from the one its placement or stage_to_device gives)."""
    per_node = hardware.devices_per_node
    if per_node is not None and per_node % width and width % per_node:
        return f"{field}: {count} devices per rank do not tile nodes of {per_node} (hardware.devices_per_node){fix}"
    ids = [d for row in (hardware.placement or ()) for d in row] + list(hardware.stage_to_device or ())
    odd = next((d for d in ids if d % width), None)
    if odd is not None:
        where = "placement" if hardware.placement else "stage_to_device"
        return (f"hardware.{where}: device {odd} is not a multiple of {width}: with {what} each rank "
                f"takes {width} consecutive devices, from the one given")
    return None


def total_devices(rank_devices: int, pipeline: Any) -> int:
    """Every device of the step, from the number of distinct devices the pipeline ranks start on."""
    return rank_devices * devices_per_rank(pipeline)


__all__ = ["context_members", "devices_per_rank", "expert_gradient_group", "gradient_group", "rank_layout_problem",
           "total_devices", "whole_layers"]
