"""torch's schedule CSV: read (torch-free) and written, checked against torch's own action strings."""

from __future__ import annotations

import pytest

from gpipe_sim.errors import ScheduleError
from gpipe_sim.schedule import SCHEDULES, Kind, build_schedule, lower
from gpipe_sim.schedule.torch_csv import parse_torch_csv, torch_csv_text

TORCH_NAMES = {"interleaved_1f1b": "Interleaved1F1B", "looped_bfs": "LoopedBFS",
               "interleaved_zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}


def test_a_hand_written_csv_with_every_cell_kind():
    text = ("0F0,0F1,,(0F2;0B0)OVERLAP_F_B,0SEND_F2,0I1,0W1,0REDUCE_GRAD,0UNSHARD\n")
    parsed = parse_torch_csv(text)
    assert parsed.orders == [[(int(Kind.FORWARD), 0, 0), (int(Kind.FORWARD), 0, 1), (int(Kind.FORWARD), 0, 2),
                              (int(Kind.BACKWARD), 0, 0), (int(Kind.BACKWARD_INPUT), 0, 1),
                              (int(Kind.BACKWARD_WEIGHT), 0, 1)]]
    assert parsed.placement == (0,) and parsed.micro_batches == 3
    assert any("OVERLAP_F_B" in n for n in parsed.notes) and any("REDUCE_GRAD" in n for n in parsed.notes)


@pytest.mark.parametrize("text, match", [
    ("0F0,0X1\n", r"rank 0, column 2: '0X1' is not an action"),
    ("0F0,0B0\n0F0,0B0\n", "stage 0 also runs on rank 0"),
    ("1F0,1B0\n", "no rank runs stage 0"),
    ("0F0,2F0\n1F0\n", "different numbers of stages"),
    ("0F\n", "names no micro-batch"),
    ("\n\n", "no rows"),
])
def test_bad_csv_is_one_line_naming_rank_and_cell(text, match):
    with pytest.raises(ScheduleError, match=match):
        parse_torch_csv(text)


@pytest.mark.parametrize("name, K, M, v", [("1f1b", 3, 5, 1), ("interleaved_1f1b", 2, 4, 2), ("zbv", 2, 4, 2),
                                           ("zb_h2", 4, 8, 1), ("dualpipev", 2, 4, 2)])
def test_our_schedules_round_trip_through_the_csv(name, K, M, v):
    schedule = build_schedule(K, M, name, "none", v)
    parsed = parse_torch_csv(torch_csv_text(schedule))
    again = lower(name, parsed.orders, parsed.placement, parsed.micro_batches, "none", parsed.chunks)
    assert again.placement == schedule.placement
    for a, b in zip(again.actions, schedule.actions):
        assert a == b


@pytest.mark.parametrize("ours", sorted(TORCH_NAMES))
@pytest.mark.parametrize("K", [2, 4, 8])
@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_torchs_own_schedules_read_and_lower_like_ours(ours, K, rounds):
    pytest.importorskip("torch")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    M = K * rounds
    try:
        rows = get_schedule_ops(TORCH_NAMES[ours], K, M, num_stages_per_rank=2)
    except ValueError:
        assert SCHEDULES[ours].problem(K, M, 2) is not None
        return
    parsed = parse_torch_csv("\n".join(",".join("" if a is None else str(a) for a in row) for row in rows))
    assert parsed.micro_batches == M and parsed.chunks == 2
    theirs = lower(ours, parsed.orders, parsed.placement, M, "always", 2)
    mine = build_schedule(K, M, ours, "always", 2)
    assert theirs.actions == mine.actions


def test_our_csv_cells_are_what_torch_parses():
    torch = pytest.importorskip("torch")  # noqa: F841
    from torch.distributed.pipelining.schedules import _Action

    text = torch_csv_text(build_schedule(2, 4, "zbv", "none", 2))
    for row in text.splitlines():
        for cell in row.split(","):
            action = _Action.from_str(cell)
            assert str(action) == cell


def test_torchs_1f1b_visualizer_row_is_refused_with_the_rank():
    """torch 2.13's `get_schedule_ops("1F1B", 2, 4)` names micro-batch 4 of 4 on rank 1."""
    pytest.importorskip("torch")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    rows = get_schedule_ops("1F1B", 2, 4)
    parsed = parse_torch_csv("\n".join(",".join("" if a is None else str(a) for a in row) for row in rows))
    with pytest.raises(ScheduleError, match="rank 1: a pass names a micro-batch outside 0..3"):
        lower("torch-1f1b", parsed.orders, parsed.placement, 4, "none", parsed.chunks)
