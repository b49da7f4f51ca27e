"""torch.distributed.pipelining's schedule CSV, parsed and written as text without torch.

One row per rank; a cell is an action as torch's `_Action` prints it: `2F0` (stage 2, forward,
micro-batch 0), `1I3`, `1W3`, `0B1` (full backward), `(0F3;3B1)OVERLAP_F_B` (a forward and a
backward that torch runs together; run here one after the other), the comms format's
`0SEND_F1` / `1RECV_F1` / `SEND_B` / `RECV_B` (dropped: the lowering adds transfers itself),
and `0REDUCE_GRAD`, `0UNSHARD`, `0RESHARD` (skipped, with a note). Empty cells are idle slots.
A torch stage is a chunk here, and the rank whose row runs it is where it lives. Files are read by
`gpipe_sim.scenario.scenario.read_schedule_csv` (the scenario's `pipeline.schedule.csv`) and written by
`gpipe-sim schedule --csv`.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field

from gpipe_sim.errors import ScheduleError
from gpipe_sim.schedule.actions import Kind
from gpipe_sim.schedule.program import Schedule

MAX_CSV_BYTES = 64 * 2**20  # the largest schedule CSV read
_LETTER_TO_KIND = {"F": Kind.FORWARD, "B": Kind.BACKWARD, "I": Kind.BACKWARD_INPUT, "W": Kind.BACKWARD_WEIGHT}
_KIND_TO_LETTER = {int(v): k for k, v in _LETTER_TO_KIND.items()}
_ACTION = re.compile(r"^(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$")
_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")
_SKIPPED = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
_COMMS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


@dataclass
class TorchSchedule:
    """Per-rank pass orders read from a CSV, with the chunk placement they imply."""

    orders: list[list[tuple[int, int, int]]]  # per rank: (Kind code, chunk, micro-batch)
    placement: tuple[int, ...]  # rank of each chunk
    micro_batches: int
    notes: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return len(self.orders)

    @property
    def chunks(self) -> int:
        """Chunks per rank (v)."""
        return len(self.placement) // max(1, self.ranks)


def parse_torch_csv(text: str) -> TorchSchedule:
    """Parse torch's schedule CSV text (see the module docstring)."""
    rows = list(csv.reader(io.StringIO(text)))
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()
    if not rows:
        raise ScheduleError("pipeline.schedule.csv: no rows (one row per rank is expected)")
    orders: list[list[tuple[int, int, int]]] = []
    owner: dict[int, int] = {}
    notes: set[str] = set()
    for rank, row in enumerate(rows):
        order: list[tuple[int, int, int]] = []
        for column, cell in enumerate(row):
            for letter, stage, mb in _cell_actions(cell.strip(), rank, column, notes):
                if owner.setdefault(stage, rank) != rank:
                    raise ScheduleError(f"pipeline.schedule.csv: rank {rank}, column {column + 1}: stage "
                                        f"{stage} also runs on rank {owner[stage]}")
                order.append((int(_LETTER_TO_KIND[letter]), stage, mb))
        orders.append(order)
    chunks = sorted(owner)
    if chunks != list(range(len(chunks))):
        missing = sorted(set(range(max(chunks) + 1)) - set(chunks)) if chunks else [0]
        raise ScheduleError(f"pipeline.schedule.csv: no rank runs stage {missing[0]}")
    placement = tuple(owner[c] for c in chunks)
    counts = [placement.count(r) for r in range(len(rows))]
    if len(set(counts)) != 1:
        raise ScheduleError(f"pipeline.schedule.csv: ranks hold different numbers of stages ({counts}); "
                            "every rank must hold the same number of chunks")
    micro_batches = 1 + max((mb for order in orders for _, _, mb in order), default=-1)
    return TorchSchedule(orders, placement, micro_batches, sorted(notes))


def _cell_actions(cell: str, rank: int, column: int, notes: set[str]) -> list[tuple[str, int, int]]:
    if not cell:
        return []
    where = f"pipeline.schedule.csv: rank {rank}, column {column + 1}"
    overlap = _OVERLAP.match(cell)
    if overlap:
        notes.add("OVERLAP_F_B pairs run one after the other (the simulator has no overlap of two passes)")
        out = []
        for part in overlap.group(1).split(";"):
            out += _cell_actions(part.strip(), rank, column, notes)
        return out
    match = _ACTION.match(cell)
    if not match:
        raise ScheduleError(f"{where}: {cell[:40]!r} is not an action (such as 0F1, 1I0, 2W3, 0B1)")
    stage, kind, mb = match.groups()
    if kind in _SKIPPED:
        notes.add(f"{kind} actions skipped (no sharding or gradient reduction is modelled)")
        return []
    if kind in _COMMS:
        notes.add("SEND/RECV actions dropped (the lowering adds the transfers each pass needs)")
        return []
    if not mb:
        raise ScheduleError(f"{where}: {cell!r} names no micro-batch")
    if len(stage) > 9 or len(mb) > 9:
        raise ScheduleError(f"{where}: {cell[:40]!r}: stage or micro-batch index too large")
    return [(kind, int(stage), int(mb))]


def torch_csv_text(schedule: Schedule) -> str:
    """A schedule's passes in torch's compute-only CSV format (what `_load_csv` reads)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for actions in schedule.actions:
        writer.writerow([f"{a.chunk}{_KIND_TO_LETTER[int(a.kind)]}{a.micro_batch}" for a in actions
                         if int(a.kind) in _KIND_TO_LETTER])
    return out.getvalue()
