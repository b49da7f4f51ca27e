"""Worker entry under torchrun: one rank of a scenario's pipeline per process, on one or several machines."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from gpipe_exec.execute import check_model
from gpipe_exec.measure.steps import measured_result

from gpipe_exec.runtime.job import job_for
from gpipe_exec.launch.spawn import LaunchOptions, run_rank
from gpipe_sim.errors import ScenarioError
from gpipe_sim.plan.compile import compile_plan
from gpipe_sim.scenario.scenario import load_scenario


def torchrun_main(argv: Sequence[str] | None = None) -> int:
    """Worker entry under torchrun: `torchrun --nproc-per-node K -m gpipe_exec.launch.torchrun SCENARIO.yaml`."""
    parser = argparse.ArgumentParser(prog="gpipe_exec.launch.torchrun")
    parser.add_argument("scenario")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    scenario = load_scenario(args.scenario)
    try:
        check_model(scenario)  # as every other launch: the model builds (with sequence parallelism, splits)
    except ScenarioError as exc:
        sys.stderr.write(f"gpipe-exec: error: {exc}\n")
        return 2
    plan = compile_plan(scenario)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != plan.mesh.num_processes:  # one process per device: T x C per rank
        sys.stderr.write(f"gpipe-exec: error: the plan has {plan.mesh.num_processes} processes (pipeline.stages x "
                         f"pipeline.data_parallel x pipeline.tensor_parallel x pipeline.context_parallel), "
                         f"torchrun started {world}\n")
        return 2
    job = job_for(plan, steps=args.steps, warmup=args.warmup)
    options = LaunchOptions(threads=args.threads, pin=False)
    out = run_rank(rank, world, [job], plan.mesh.process_devices(), options)
    if rank == 0:
        measurement = measured_result(plan, out[0])
        sys.stdout.write(measurement.result.to_json(timeline=args.json) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as in _worker: no C++ static destructors after the process group is gone


if __name__ == "__main__":
    sys.exit(torchrun_main())
