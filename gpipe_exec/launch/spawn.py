"""Starting the ranks: K processes on this machine (spawned and watched), or one rank under torchrun."""

from __future__ import annotations

import faulthandler
import json
import multiprocessing.connection
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpipe_exec.launch.devices import check_gpu_layout, configure_cuda_math, device_type, transport
from gpipe_exec.measure.allocator import cache_host_memory
from gpipe_exec.runtime.device_lock import LOCK_DIR_ENV
from gpipe_exec.errors import ExecutionError, PeerError
from gpipe_sim.errors import first_line
from gpipe_exec.measure.meters import AlignedClock
from gpipe_exec.runtime.interpreter import run_job
from gpipe_exec.runtime.job import Job


@dataclass(frozen=True)
class LaunchOptions:
    """How ranks run: torch threads each, pinning to the scenario's devices, and time limits."""

    threads: int = 1
    pin: bool = True
    comm_timeout_s: float = 60.0  # gloo/NCCL collective and point-to-point timeout
    run_timeout_s: float = 1800.0  # the whole launch
    backend: str | None = None  # None: as `launch.devices.transport` picks (nccl, or gloo)
    device: str | None = None  # cpu | cuda | auto; None: $GPIPE_EXEC_DEVICE, else auto (`devices.device_type`)
    serialize_shared_devices: bool = True  # stages on one device compute one at a time (device_lock)
    cache_host_memory: bool = True  # malloc keeps freed memory for reuse (allocator.cache_host_memory)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _setup_rank(rank: int, device_map: Sequence[int], options: LaunchOptions) -> torch.device:
    torch.set_num_threads(max(1, options.threads))
    if options.cache_host_memory:
        cache_host_memory()
    if device_type(options.device) == "cuda":
        # Under torchrun on several machines, LOCAL_RANK picks this machine's GPU.
        local = int(os.environ.get("LOCAL_RANK", device_map[rank]))
        check_gpu_layout([local], torch.cuda.device_count())
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        configure_cuda_math()
        return device
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    devices = sorted(set(device_map))
    if options.pin and cores and len(devices) <= len(cores):
        # Device d of the scenario is a set of cores; stages sharing it also take turns under its
        # device lock. Measured on 2 cores, K=4, with the profile taken the same way
        # (`profile_on_devices`): pinned, the transformer's steps were 312-320 ms against 372-406 ms
        # unpinned and its stages computed at 0.91-1.0x their profile (0.79-1.22x unpinned); the
        # convnet was the same either way. (Profiled by one process per device, unpinned was
        # better: a stage that got the lock was not stuck behind the one that released it.)
        per = len(cores) // len(devices)
        d = devices.index(device_map[rank])
        os.sched_setaffinity(0, set(cores[d * per:(d + 1) * per]))
    return torch.device("cpu")


# A task runs on every rank: task(rank, device, clock, payload) -> rank 0's answer.
Task = Callable[[int, torch.device, AlignedClock, Any], Any]


def run_jobs(rank: int, device: torch.device, clock: AlignedClock, jobs: list[Job]) -> list[dict[str, Any]]:
    """The executor's task: run the jobs in order in this process group."""
    return [run_job(job, rank, device, clock) for job in jobs]


def run_rank(rank: int, world: int, payload: Any, device_map: Sequence[int], options: LaunchOptions,
             init_method: str = "env://", task: Task = run_jobs) -> Any:
    """One rank: join the process group, align clocks, run the task, leave the group."""
    device = _setup_rank(rank, device_map, options)
    if options.serialize_shared_devices and LOCK_DIR_ENV not in os.environ:
        # One lock directory per launch (per rendezvous under torchrun), shared by this machine's ranks.
        where = init_method.replace("/", "_").replace(":", "_") + "_" + os.environ.get("MASTER_PORT", "")
        lock_dir = Path(tempfile.gettempdir()) / f"gpipe-exec-locks{where}"
        lock_dir.mkdir(exist_ok=True)
        os.environ[LOCK_DIR_ENV] = str(lock_dir)
    dist.init_process_group(transport(device.type, device_map, options.backend).backend,
                            init_method=init_method, rank=rank,
                            world_size=world, timeout=timedelta(seconds=options.comm_timeout_s))
    try:
        clock = AlignedClock.synchronize()
        answer = task(rank, device, clock, payload)
        # No rank leaves while a peer may still read from it: a socket closed with data unread
        # resets the connection, and the peer's pending receive fails ("closed by peer").
        dist.barrier()
        return answer
    finally:
        dist.destroy_process_group()


def _worker(rank: int, world: int, port: int, payload: Any, device_map: Sequence[int],
            options: LaunchOptions, out_dir: str, task: Task) -> None:
    # A native crash still shows where in Python it happened: on stderr, and in the parent's message.
    fault_log = open(Path(out_dir) / f"fault{rank}.txt", "w")  # noqa: SIM115 - open until exit
    faulthandler.enable(file=fault_log)
    if options.serialize_shared_devices:
        os.environ[LOCK_DIR_ENV] = out_dir  # removed with the launch's temporary directory
    try:
        results = run_rank(rank, world, payload, device_map, options, f"tcp://127.0.0.1:{port}", task)
        if rank == 0:
            torch.save(results, Path(out_dir) / "result.pt")
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip C++ static destructors: a gloo thread torn down at interpreter exit can abort().
        os._exit(0)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then exit non-zero
        record = {
            "rank": rank, "time": time.time(), "peer": isinstance(exc, PeerError) or lost_peer(exc),
            "message": first_line(exc) if str(exc).strip() else "", "type": type(exc).__name__,
            "traceback": traceback.format_exc(),
        }
        (Path(out_dir) / f"error{rank}.json").write_text(json.dumps(record))
        os._exit(1)


# How gloo and NCCL say that the other end of a connection went away: a consequence of a peer's
# failure, never the cause.
_LOST_PEER = ("closed by peer", "reset by peer", "broken pipe", "connection refused", "socket closed")


def lost_peer(exc: BaseException) -> bool:
    """Whether `exc` says only that a peer's connection went away (that peer failed first)."""
    text = str(exc).lower()
    return any(words in text for words in _LOST_PEER)


def _rank_errors(out_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(out_dir.glob("error*.json"))]


def _crash_site(out_dir: Path, rank: int) -> str:
    """The innermost Python frame of the crashing thread, as faulthandler wrote it for a rank that
    crashed natively (its dump lists every thread; the crashing one is headed "Current thread"), or ''."""
    path = out_dir / f"fault{rank}.txt"
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    start = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), 0)
    frames = [line.strip() for line in lines[start:] if line.strip().startswith("File ")]
    return f" at {frames[0]}" if frames else ""


def _failure_message(errors: list[dict[str, Any]], exitcodes: dict[int, int | None],
                     out_dir: Path | None = None) -> str:
    own = sorted((e for e in errors if not e["peer"]), key=lambda e: e["time"])
    if own:
        e = own[0]
        return f"rank {e['rank']} failed: {e['type']}: {e['message']} (the other ranks were stopped)"
    reported = {e["rank"] for e in errors}
    for rank, code in exitcodes.items():
        if code is not None and code < 0 and rank not in reported:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            site = _crash_site(out_dir, rank) if out_dir is not None else ""
            return f"rank {rank} was killed by {name}{site} (the other ranks were stopped)"
    for rank, code in exitcodes.items():
        if code not in (0, None) and rank not in reported:
            return f"rank {rank} exited with status {code} (the other ranks were stopped)"
    if errors:
        e = min(errors, key=lambda e: e["time"])
        return f"rank {e['rank']} failed: {e['message']}"
    return "a rank failed without a message"


def launch(jobs: Any, device_map: Sequence[int], options: LaunchOptions = LaunchOptions(),
           task: Task = run_jobs) -> Any:
    """Spawn one process per rank, run `task` (by default: `jobs` in order), return rank 0's answer.

    If any rank fails, the others are stopped within about a second and ExecutionError names the
    failing rank; the whole launch is bounded by `options.run_timeout_s`.
    """
    world = len(device_map)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="gpipe-exec-") as tmp:
        port = _free_port()
        procs = [
            ctx.Process(target=_worker, args=(r, world, port, jobs, tuple(device_map), options, tmp, task),
                        daemon=False, name=f"gpipe-exec-rank{r}")
            for r in range(world)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + options.run_timeout_s
        failed = False
        first_codes: dict[int, int | None] = {}
        try:
            while any(p.is_alive() for p in procs):
                alive = [p.sentinel for p in procs if p.is_alive()]
                multiprocessing.connection.wait(alive, timeout=0.5)
                if any(p.exitcode not in (None, 0) for p in procs):
                    failed = True
                    break
                if time.monotonic() > deadline:
                    raise ExecutionError(f"the run took longer than {options.run_timeout_s:.0f} s; stopped")
            if failed:
                first_codes = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode not in (None, 0)}
                grace = time.monotonic() + 1.0  # let peers record how they saw the failure
                while time.monotonic() < grace and any(p.is_alive() for p in procs):
                    time.sleep(0.05)
        finally:
            _stop(procs)
        codes = {r: p.exitcode for r, p in enumerate(procs)}
        if failed or any(c != 0 for c in codes.values()):
            errors = _rank_errors(Path(tmp))
            for path in sorted(Path(tmp).glob("fault*.txt")):  # native crashes, in full, for the log
                if path.stat().st_size:
                    sys.stderr.write(f"{path.stem}: " + path.read_text(errors="replace"))
            # Ranks that had failed before the others were stopped come first.
            exc = ExecutionError(_failure_message(errors, {**first_codes, **{
                r: c for r, c in codes.items() if r not in first_codes}}, Path(tmp)))
            exc.rank_errors = errors  # type: ignore[attr-defined]
            raise exc
        return torch.load(Path(tmp) / "result.pt", weights_only=False)


def _stop(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    limit = time.monotonic() + 3.0
    for p in procs:
        p.join(timeout=max(0.0, limit - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
