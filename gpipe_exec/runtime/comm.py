"""Point-to-point transfers between ranks, and the process groups they and the gradient reductions use."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from gpipe_exec.errors import ExecutionError, PeerError
from gpipe_sim.errors import first_line
from gpipe_sim.mesh import Mesh
from gpipe_sim.schedule import Action, Kind, Tensor

_DIRECTION_GROUPS: tuple[Any, dict[Tensor, Any]] | None = None  # (default group, its two groups)


def direction_groups() -> dict[Tensor, Any]:
    """One process group for activations and one for gradients, made once per default group
    (collective: every rank builds its runner, so every rank gets here in the same order)."""
    global _DIRECTION_GROUPS
    default = dist.distributed_c10d._get_default_group()
    if _DIRECTION_GROUPS is None or _DIRECTION_GROUPS[0] is not default:
        ranks = list(range(dist.get_world_size()))
        _DIRECTION_GROUPS = (default, {Tensor.ACTIVATION: dist.new_group(ranks),
                                       Tensor.GRADIENT: dist.new_group(ranks)})
    return _DIRECTION_GROUPS[1]


_DP_GROUPS: tuple[Any, int, int, list[Any]] | None = None  # (default group, K, D, group per pipeline rank)


def data_parallel_groups(mesh: Mesh) -> list[Any]:
    """Per pipeline rank r, the process group of its D replicas (`Mesh.replica_processes`), made
    once per (default group, K, D); collective: every rank creates all K, in the same order."""
    global _DP_GROUPS
    default = dist.distributed_c10d._get_default_group()
    K, D = mesh.stages, mesh.data_parallel
    if _DP_GROUPS is None or _DP_GROUPS[0] is not default or _DP_GROUPS[1:3] != (K, D):
        if dist.get_world_size() != mesh.num_processes:
            raise ExecutionError(f"{dist.get_world_size()} processes for {D} replicas of {K} ranks")
        _DP_GROUPS = (default, K, D, [dist.new_group(mesh.replica_processes(r)) for r in range(K)])
    return _DP_GROUPS[3]


def stages_through_host(kind: str, backend: str) -> bool:
    """Whether transfers between ranks on devices of `kind` over `backend` go through host memory
    (`Comm.staged`): gloo moves no CUDA tensors point to point."""
    return kind == "cuda" and backend == "gloo"


def reduce_scatter_in_place(output: torch.Tensor, flat: torch.Tensor, group: Any,
                            op: Any = dist.ReduceOp.SUM, async_op: bool = False) -> Any:
    """Reduce `flat` over `group` (op), this process receiving its equal part in `output`, reading
    `flat` where it lies, as NCCL's `reduce_scatter_tensor` does: over gloo as a list of the parts
    (gloo's flat-tensor form first copies the whole input into a new tensor, held while it runs:
    measured on torch 2.13), else flat (NCCL's list form is the one that copies)."""
    if dist.get_backend(group) == "gloo":
        parts = list(flat.chunk(dist.get_world_size(group)))
        return dist.reduce_scatter(output, parts, op=op, group=group, async_op=async_op)
    return dist.reduce_scatter_tensor(output, flat, op=op, group=group, async_op=async_op)


class Comm:
    """Point-to-point transfers tagged by message key, with clear errors on peer failure.

    A message's key (`ProgramColumns.message_keys`: chunk boundary, tensor, micro-batch) is unique
    in the step and shared by its send and receive: it is the gloo tag. With `split`, activations
    and gradients travel in two process groups of their own. NCCL runs a pair of ranks' sends and
    receives in order on one stream per communicator, and a send may wait for its receive: in 1F1B
    a rank's next activation send queued before its gradient receive, while its peer's gradient
    send is queued before that activation's receive, would wait on each other forever. Each
    direction in its own group flows in one order on both ends.

    `staged` (gloo joining ranks that share a GPU: `launch.devices.transport`): gloo moves no CUDA
    tensors, so a send copies its tensor to host memory first and receives land in host buffers
    (`_buffer`), copied to the GPU when awaited (`_recv`).
    """

    def __init__(self, rank: int, split: bool = False, staged: bool = False) -> None:
        self.rank = rank
        self.groups: dict[Tensor, Any] = direction_groups() if split else {}
        self.staged = staged

    def _guard(self, peer: int, what: str, fn: Callable[[], Any]) -> Any:
        return self._guarded(f"{what} rank {peer}", fn)

    def _guarded(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (RuntimeError, dist.DistError) as exc:
            raise PeerError(f"rank {self.rank}: {what} failed ({first_line(exc)})") from None

    def allreduce(self, bucket: torch.Tensor, group: Any, chunk: int) -> Any:
        """Start the sum of `bucket` over the data-parallel group (asynchronous)."""
        return self._guarded(f"all-reduce of chunk {chunk} with its replicas",
                             lambda: dist.all_reduce(bucket, group=group, async_op=True))

    def reduce_scatter(self, output: torch.Tensor, flat: torch.Tensor, group: Any, chunk: int) -> Any:
        """Start the sum of `flat` over the data-parallel group, this process receiving its equal
        part in `output` (asynchronous; ZeRO-1: runtime.zero_shards; `reduce_scatter_in_place`)."""
        return self._guarded(f"reduce-scatter of chunk {chunk} with its replicas",
                             lambda: reduce_scatter_in_place(output, flat, group, async_op=True))

    def wait_collective(self, work: Any, chunk: int) -> None:
        self._guarded(f"reduction of chunk {chunk} with its replicas", work.wait)

    def isend(self, tensor: torch.Tensor, action: Action, tag: int) -> Any:
        group = self.groups.get(action.tensor)
        payload = tensor.detach().to("cpu") if self.staged else tensor.contiguous()
        work = self._guard(action.peer, "send to",
                           lambda: dist.isend(payload, action.peer, group=group, tag=tag))
        return _StagedSend(work, payload) if self.staged else work

    def irecv(self, buffer: torch.Tensor, action: Action, tag: int) -> Any:
        group = self.groups.get(action.tensor)
        return self._guard(action.peer, "receive from",
                           lambda: dist.irecv(buffer, action.peer, group=group, tag=tag))

    def wait(self, work: Any, action: Action) -> None:
        what = "send to" if action.kind == Kind.SEND else "receive from"
        self._guard(action.peer, what, work.wait)


class _StagedSend:
    """A send of a host copy: the work, and the copy kept alive until the send completes."""

    def __init__(self, work: Any, payload: torch.Tensor) -> None:
        self.work, self.payload = work, payload

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())

    def wait(self) -> Any:
        return self.work.wait()


__all__ = ["Comm", "data_parallel_groups", "direction_groups", "reduce_scatter_in_place", "stages_through_host"]
