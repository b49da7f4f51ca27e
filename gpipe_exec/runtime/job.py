"""What the executor is handed: a job, the compiled plan and how to run it (steps, seed, faults)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gpipe_exec.runtime.split_backward import WeightPass
from gpipe_sim.errors import GpipeError
from gpipe_sim.plan.compile import Plan
from gpipe_sim.model.model import ModelSpec

FAULT_ENV = "GPIPE_EXEC_FAULT"  # fault injection for tests: "RANK:raise|kill|crash[:ACTION[:STEP]]"


def parse_fault(text: str) -> dict[str, Any]:
    """Parse a fault-injection spec such as "1:kill:3" (rank 1 is killed before its action 3)."""
    parts = text.split(":")
    try:
        fault = {"rank": int(parts[0]), "kind": parts[1],
                 "action": int(parts[2]) if len(parts) > 2 else 0,
                 "step": int(parts[3]) if len(parts) > 3 else 0}
    except (IndexError, ValueError):
        raise GpipeError(f"{FAULT_ENV}: expected RANK:raise|kill[:ACTION[:STEP]], got {text!r}") from None
    if fault["kind"] not in ("raise", "kill", "crash"):
        raise GpipeError(f"{FAULT_ENV}: kind must be raise, kill or crash, got {fault['kind']!r}")
    return fault


@dataclass
class Job:
    """One configuration to run: the compiled plan (its chunks, micro-batch sizes, devices and the
    global program each rank runs its slice of, exactly as the simulator runs it) and how to run it."""

    plan: Plan
    # The zoo model the ranks build; None: the plan's own. (A plan priced from a measured layer
    # table has the table as its model: the validation runs it with the model that was profiled.)
    model: ModelSpec | None = None
    steps: int = 1
    warmup: int = 0
    seed: int = 0
    dropout: float | None = None
    return_params: bool = False
    device_lock: bool = True  # serialize the compute of ranks sharing a device (CPU)
    # Receives posted ahead of the action that needs them: n, 0 (each at its own action), or None:
    # on CPU all of the step's, before it starts; on CUDA each at its action (NCCL runs a pair's
    # sends and receives in order on one stream, so a receive posted ahead would hold back the
    # sends queued behind it). On gloo a receive posted before its send lets the data move as soon
    # as it is sent; posted late, the rendezvous waits for the sender's next wait (measured on the
    # accuracy study's convnet, K=2, M=16: 62-115 ms steps with two ahead, 55-70 ms with all).
    # The price: a buffer per receive, held all step (M boundary tensors per boundary and direction).
    recv_window: int | None = None
    # Activations and gradients in process groups of their own (see runtime.comm.Comm); None: on CUDA.
    split_directions: bool | None = None
    weight_pass: WeightPass = "reuse"  # how a backward_weight pass works (runtime.split_backward)
    fault: dict[str, Any] | None = None  # {"rank", "kind": raise|kill|crash, "step", "action"} (tests)
    # One more step after the warm-up and timed ones, measuring each rank's real tensor memory
    # (`RankRunner.step(memory=True)`); the timed steps carry no tracker. Returned parameters are
    # those before it.
    memory_step: bool = False
    tag: str = ""


def job_for(plan: Plan, *, steps: int = 5, warmup: int = 2, seed: int = 0,
            dropout: float | None = None, **extra: Any) -> Job:
    """The job that runs the plan as compiled: its partition, micro-batches and global program (a
    schedule registered in this process needs no registration in the workers)."""
    if "fault" not in extra and os.environ.get(FAULT_ENV):
        extra["fault"] = parse_fault(os.environ[FAULT_ENV])
    extra.setdefault("memory_step", True)
    return Job(plan=plan, steps=steps, warmup=warmup, seed=seed, dropout=dropout, **extra)
