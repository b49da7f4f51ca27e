"""The mesh: process numbering against a hand-written table, device lists, and its one-line refusals."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gpipe_sim.errors import ScenarioError
from gpipe_sim.mesh import Mesh, mesh_problem, node_of, tensor_members, tiles_nodes
from gpipe_sim.scenario.scenario import parse_scenario

# D = 2 replicas, K = 2 pipeline ranks, C = 2, T = 2, nodes of 4 devices, Megatron-LM's order:
# (replica d, pipeline rank r, context rank c, tensor rank t) -> process -> device -> node, written
# out by hand. A pipeline rank's T x C = 4 devices are consecutive (one node), its replicas are 4
# devices apart, and consecutive pipeline ranks D x T x C = 8 apart.
TABLE = [  # d, r, c, t, process, device, node
    (0, 0, 0, 0, 0, 0, 0), (0, 0, 0, 1, 1, 1, 0), (0, 0, 1, 0, 2, 2, 0), (0, 0, 1, 1, 3, 3, 0),
    (0, 1, 0, 0, 4, 8, 2), (0, 1, 0, 1, 5, 9, 2), (0, 1, 1, 0, 6, 10, 2), (0, 1, 1, 1, 7, 11, 2),
    (1, 0, 0, 0, 8, 4, 1), (1, 0, 0, 1, 9, 5, 1), (1, 0, 1, 0, 10, 6, 1), (1, 0, 1, 1, 11, 7, 1),
    (1, 1, 0, 0, 12, 12, 3), (1, 1, 0, 1, 13, 13, 3), (1, 1, 1, 0, 14, 14, 3), (1, 1, 1, 1, 15, 15, 3),
]


def _scenario(pipeline: dict, hardware: dict | None = None):
    return parse_scenario({
        "model": {"preset": "transformer", "layers": 4, "d_model": 64, "d_ff": 128, "heads": 4, "seq_len": 64,
                  "vocab": 128, "attention": "flash"},
        "hardware": {"preset": "a100-80gb", **(hardware or {})},
        "pipeline": {"micro_batches": 2, "batch_size": 4, **pipeline},
    })


def test_processes_devices_and_nodes_follow_the_hand_written_table() -> None:
    mesh = _scenario({"stages": 2, "data_parallel": 2, "tensor_parallel": 2, "context_parallel": 2},
                     {"devices_per_node": 4}).mesh
    assert (mesh.num_ranks, mesh.devices_per_rank, mesh.num_processes, mesh.num_devices) == (4, 4, 16, 16)
    for d, r, c, t, process, device, node in TABLE:
        g = mesh.program_rank(d, r)
        assert (mesh.replica(g), mesh.pipeline_rank(g)) == (d, r)
        assert mesh.process(g, c, t) == process
        assert mesh.coordinates(process) == (g, c, t)
        assert mesh.device(g, c, t) == device
        assert mesh.node(device) == node
    assert mesh.process_devices() == tuple(row[5] for row in sorted(TABLE, key=lambda row: row[4]))
    assert mesh.pipeline_rank(np.arange(4)).tolist() == [0, 1, 0, 1]  # arrays of program ranks too
    assert mesh.replica(np.arange(4)).tolist() == [0, 0, 1, 1]


def test_groups_are_the_table_s_devices() -> None:
    mesh = _scenario({"stages": 2, "data_parallel": 2, "tensor_parallel": 2, "context_parallel": 2,
                      "expert_parallel": 1}, {"devices_per_node": 4}).mesh
    assert (mesh.gradient_group, mesh.expert_gradient_group) == (4, 4)
    assert mesh.context_members(8) == [8, 10]  # replica 0, rank 1, tensor rank 0: c = 0 and 1
    assert mesh.gradient_members(1) == [8, 10, 12, 14]  # rank 1 of both replicas, both context ranks
    assert Mesh(data_parallel=4, tensor_parallel=2, expert_parallel=2).expert_members(2) == [2, 4]
    assert not mesh.whole_layers and Mesh().whole_layers
    # the executor's process groups, in the table's process numbers
    processes = {(d, r, c, t): q for d, r, c, t, q, _, _ in TABLE}
    for r in range(2):
        for c in range(2):
            for t in range(2):
                assert mesh.replica_processes(r, c, t) == [processes[0, r, c, t], processes[1, r, c, t]]
    # a torch DeviceMesh's shape: process q = ((d*K + r)*C + c)*T + t, row-major over (dp, pp, cp, tp)
    assert mesh.process_grid == (("dp", 2), ("pp", 2), ("cp", 2), ("tp", 2))
    shape = [size for _, size in mesh.process_grid]
    assert all(int(np.ravel_multi_index((d, r, c, t), shape)) == q for (d, r, c, t), q in processes.items())
    assert Mesh(data_parallel=2, stages=3, tensor_parallel=2).process_grid == (("dp", 2), ("pp", 3), ("tp", 2))


def test_given_devices_are_taken_as_written() -> None:
    placed = _scenario({"stages": 2, "data_parallel": 2}, {"placement": [[0, 3], [1, 2]]}).mesh
    assert placed.rank_devices == (0, 3, 1, 2)
    shared = _scenario({"stages": 3}, {"stage_to_device": [0, 1, 0]}).mesh
    assert shared.rank_devices == (0, 1, 0)
    assert (shared.num_ranks, shared.num_processes, shared.num_devices) == (3, 3, 2)


@pytest.mark.parametrize("pipeline, hardware, message", [
    ({"stages": 2}, {"stage_to_device": [0]}, "hardware.stage_to_device: 1 entries for 2 stages"),
    ({"stages": 2, "data_parallel": 2}, {"placement": [[0, 1]]},
     "hardware.placement: give 2 rows (one per replica) of 2 devices"),
    ({"stages": 2, "data_parallel": 2}, {"stage_to_device": [0, 1]},
     "hardware.stage_to_device: with data_parallel > 1 give hardware.placement instead"),
    ({"stages": 1, "tensor_parallel": 4}, {"devices_per_node": 6},
     "pipeline.tensor_parallel: 4 devices per rank do not tile nodes of 6 (hardware.devices_per_node)"),
    ({"stages": 2, "tensor_parallel": 2}, {"stage_to_device": [0, 3]},
     "hardware.stage_to_device: device 3 is not a multiple of 2"),
    ({"stages": 1, "tensor_parallel": 2, "context_parallel": 2}, {"devices_per_node": 6},
     "pipeline.context_parallel: 2 x 2 devices per rank do not tile nodes of 6"),
])
def test_a_mesh_that_does_not_fit_is_refused_in_one_line(pipeline, hardware, message) -> None:
    with pytest.raises(ScenarioError) as info:
        _scenario(pipeline, hardware)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_mesh_problem_is_the_scenario_s_check() -> None:
    pipeline = SimpleNamespace(stages=2, data_parallel=1, tensor_parallel=2, context_parallel=1)
    hardware = SimpleNamespace(devices_per_node=None, placement=None, stage_to_device=(0, 1))
    assert mesh_problem(pipeline, hardware).startswith("hardware.stage_to_device: device 1 is not a multiple of 2")
    assert mesh_problem(pipeline, SimpleNamespace(devices_per_node=8, placement=None, stage_to_device=None)) is None
    assert [w for w in range(1, 17) if tiles_nodes(8, w)] == [1, 2, 4, 8, 16]


def test_nodes_and_tensor_groups_of_single_devices_and_arrays() -> None:
    assert tensor_members(8, 4) == [8, 9, 10, 11]
    assert node_of(np.array(tensor_members(6, 4)), 4).tolist() == [1, 1, 2, 2]  # a group across two nodes
    assert node_of(np.arange(3), None).tolist() == [0, 0, 0] and node_of(7, None) == 0  # one node
