"""ZeRO-1 as Megatron-LM's distributed optimizer (gpipe_exec.runtime.zero_shards), without a launch:
each bucket padded to N equal parts and reduce-scattered, each replica writing back its part only."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpipe_exec.runtime.zero_shards import ShardGroup, ShardLayout, ZeroShardUpdate  # noqa: E402
from gpipe_sim.scenario.scenario import parse_scenario  # noqa: E402

N = 2  # replicas


class SummingComm:
    """Both replicas' reduce-scatters of one bucket, run once both have started: part i of the sum
    to replica i (as torch.distributed.reduce_scatter_tensor)."""

    def __init__(self) -> None:
        self.started: list[tuple[torch.Tensor, torch.Tensor]] = []

    def reduce_scatter(self, output: torch.Tensor, flat: torch.Tensor, group: object, chunk: int) -> int:
        self.started.append((output, flat))
        return len(self.started) - 1

    def wait_collective(self, work: int, chunk: int) -> None:
        if len(self.started) % N == 0:  # every replica's input is there
            group = self.started[-N:]
            total = sum(flat for _, flat in group)
            for i, (output, _) in enumerate(group):
                output.copy_(total.chunk(N)[i])


def _scenario():
    return parse_scenario({"model": {"preset": "mlp", "layers": 2, "width": 4, "input_dim": 3, "num_classes": 2},
                           "hardware": {"preset": "cpu"},
                           "pipeline": {"stages": 1, "data_parallel": N, "micro_batches": 1, "batch_size": 2},
                           "training": {"optimizer": "sgd", "zero": 1}})


def test_layout_parts_are_equal_and_clipped() -> None:
    layouts = [ShardLayout(11, 2, i) for i in range(2)]
    assert [(s.part, s.lo, s.hi) for s in layouts] == [(6, 0, 6), (6, 6, 11)]


def test_each_bucket_is_reduce_scattered_and_only_the_owned_part_written_back() -> None:
    comm = SummingComm()
    replicas = []
    for i in range(N):
        params = [torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(5))]  # 11 elements
        for q, value in zip(params, (1.0 + i, 10.0 * (1 + i))):
            q.grad = torch.full_like(q, value)
        replicas.append((params, ZeroShardUpdate({0: [params]}, _scenario(), i, N, None, comm)))
    for _, update in replicas:
        update.start(0, 0)
    assert all(flat.numel() == 12 and out.numel() == 6 for out, flat in comm.started)  # padded 11 -> 2 x 6
    for _, update in replicas:
        update.finish(0, 0)
    whole = torch.cat([torch.full((6,), 3.0), torch.full((5,), 30.0)])  # the summed gradient, flattened
    for i, (params, _) in enumerate(replicas):
        flat = torch.cat([q.grad.reshape(-1) for q in params])
        lo, hi = 6 * i, min(6 * (i + 1), 11)
        assert torch.equal(flat[lo:hi], whole[lo:hi])  # its part reduced
        other = torch.cat([torch.full((6,), 1.0 + i), torch.full((5,), 10.0 * (1 + i))])
        rest = torch.ones(11, dtype=torch.bool)
        rest[lo:hi] = False
        assert torch.equal(flat[rest], other[rest])  # the rest as its own backward left it


def test_an_expert_bucket_held_by_one_process_is_stepped_whole_without_a_collective() -> None:
    """Expert parallelism with D = E: a routed expert's bucket has an expert-data-parallel group of
    one (`ShardGroup(None, 1, 0)`): its gradient is the sum already, its whole is this process's part,
    the dense bucket still reduce-scattered over the N replicas."""
    comm = SummingComm()
    replicas = []
    for i in range(N):
        dense, expert = torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(3))
        dense.grad, expert.grad = torch.full_like(dense, 1.0 + i), torch.full_like(expert, 7.0 + i)
        update = ZeroShardUpdate({0: [[dense]]}, _scenario(), i, N, None, comm, {0: [[expert]]}, ShardGroup(None, 1, 0))
        replicas.append((dense, expert, update))
    for *_, update in replicas:
        assert update.of_chunk == {0: [0, 1]}
        update.start(0, 0)
        update.start(0, 1)
    assert len(comm.started) == N  # the dense bucket's reduce-scatters only
    for i, (dense, expert, update) in enumerate(replicas):
        update.finish(0, 0)
        update.finish(0, 1)
        assert torch.equal(expert.grad, torch.full((3,), 7.0 + i))  # its own, whole
        assert update.master.numel() == (3, 2)[i] + 3  # its dense part (5 cut 3 + 2) and the whole expert


def test_a_bucket_reduction_allocates_its_padded_copy_and_its_part_only() -> None:
    """The tensor tracker's peak over `start` (one bucket of 11 fp32 elements, N = 2: padded to 12,
    parts of 6) is the padded copy and the received part, (N + 1) s elements, as the simulator's
    `sharded_buckets` holds from the `allreduce` to its wait: the gradients are copied into the
    bucket one by one, never held twice (a concatenation then padded held 2 x 11 + 12 elements)."""
    from gpipe_exec.measure.memory import StorageTracker

    params = [torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(5))]
    for q in params:
        q.grad = torch.ones_like(q)
    update = ZeroShardUpdate({0: [params]}, _scenario(), 0, N, None, SummingComm())
    with StorageTracker() as tracker:
        tracker.track([q.grad for q in params], "gradients")
        tracker.reset_peak()
        update.start(0, 0)
    _, flat, mine = update.pending[0]
    assert torch.equal(flat, torch.cat([torch.ones(11), torch.zeros(1)]))  # the gradients, then zeros
    assert tracker.peak - 11 * 4 == (N + 1) * 6 * 4 == flat.untyped_storage().nbytes() + mine.untyped_storage().nbytes()


@pytest.mark.parametrize("tied", [False, True])
def test_simulated_buckets_are_the_executors_a_tied_table_held_once(tied: bool) -> None:
    """ZeRO-1's buckets of a one-chunk transformer in 4 kB buckets: the simulator's (dense,
    experts') elements per bucket (`bucket_sizes`) are what gpipe-exec's `bucket_groups` puts in
    each, a tied token table counted once, in the head's bucket, as both hold it."""
    from gpipe_exec.runtime.grad_buckets import bucket_groups
    from gpipe_exec.zoo import build_layers_range
    from gpipe_sim.plan.buckets import reduction_size
    from gpipe_sim.plan.compile import compile_plan
    from gpipe_sim.plan.zero_shards import bucket_sizes

    sc = parse_scenario({
        "model": {"preset": "transformer", "layers": 2, "d_model": 16, "d_ff": 32, "heads": 2, "seq_len": 8,
                  "vocab": 64, "tied_embeddings": tied},
        "hardware": {"preset": "cpu"},
        "pipeline": {"stages": 1, "data_parallel": 2, "micro_batches": 1, "batch_size": 2},
        "training": {"optimizer": "sgd", "zero": 1, "overlap_grad_reduce": True, "bucket_bytes": "4 kB"}})
    plan = compile_plan(sc)
    simulated = bucket_sizes(plan, plan.chunks[0])
    layers = build_layers_range(sc.model, 0, len(plan.layers) - 1)
    executed = [sum(p.numel() for p in group) for group in bucket_groups(layers, reduction_size(sc))]
    assert [dense + experts for dense, experts in simulated] == executed
    assert sum(executed) == plan.chunks[0].params
