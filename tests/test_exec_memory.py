"""Memory measured independently of the prediction: the storage tracker, transients, predicted vs measured."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpipe_exec.measure.memory import (GRADIENTS, OPTIMIZER, PARAMETERS, StorageTracker, gradients_as_gradients,
                                       module_state)
from gpipe_exec.measure.meters import SavedBytesMeter
from gpipe_sim.api import simulate
from gpipe_sim.plan.compile import chunk_transient_bytes, compile_plan
from gpipe_sim.model.model import LayerSpec
from gpipe_sim.scenario.scenario import parse_scenario


class BigTemporary(torch.nn.Module):
    """y = x * 2 + (x repeated `copies` times, summed back): the repeat is a temporary of the forward
    that nothing saves (sum saves no tensor; mul by a constant none either)."""

    def __init__(self, copies: int) -> None:
        super().__init__()
        self.copies = copies

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = x.repeat(self.copies, 1)
        return x * 2 + big.sum(0, keepdim=True)


def test_tracker_counts_a_known_allocation_exactly() -> None:
    tracker = StorageTracker()
    with tracker:
        with tracker.during("forward"):
            a = torch.empty(1000, dtype=torch.float32)
            view = a[10:20]  # a view adds nothing
            b = torch.zeros(250, dtype=torch.float64)
        assert tracker.total == 4000 + 2000 and tracker.by_category["forward"] == 6000
        del a
        assert tracker.total == 6000  # the view keeps the storage
        del view
        assert tracker.total == 2000
        del b
    assert tracker.total == 0 and tracker.peak == 6000


def test_tracker_breaks_a_training_step_down_by_category() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    params = (8 * 16 + 16 + 16 * 4 + 4) * 4
    x = torch.randn(5, 8)
    for _ in range(2):  # the second step has the momentum buffers and gradients already
        tracker = StorageTracker()
        module_state(tracker, [model], [opt])
        tracker.reset_peak()
        with tracker, gradients_as_gradients(tracker, model.parameters()):
            with tracker.during("forward"):
                loss = model(x).sum()
            # the first Linear's output (5 x 16) is saved by the second; the loss; the output 5 x 4 is freed
            assert tracker.by_category["forward"] == 5 * 16 * 4 + 4
            with tracker.during("backward"):
                loss.backward()
            del loss
            with tracker.during("update"):
                opt.step()
        assert tracker.by_category[PARAMETERS] == params
        assert tracker.by_category[GRADIENTS] == params
    assert tracker.by_category[OPTIMIZER] == params  # registered from the first step's update


def test_measured_peak_sees_a_temporary_the_saved_tensor_count_does_not() -> None:
    layer = BigTemporary(copies=50)
    x = torch.randn(4, 100, requires_grad=True)
    meter = SavedBytesMeter([layer])
    tracker = StorageTracker()
    with tracker:
        tracker.mark()
        with meter.track(0):
            y = layer(x)
    assert meter.peak == 0  # nothing saved for backward
    # the repeat (50 x 4 x 100 floats) was live at once with the output's intermediates
    assert tracker.interval_peak >= 50 * 4 * 100 * 4
    assert tracker.total == y.numel() * 4


def test_profiled_transient_is_the_temporary() -> None:
    from gpipe_exec.profile import transient_bytes

    layer = BigTemporary(copies=50)
    x = torch.randn(4, 100)
    forward = transient_bytes(layer, x, torch.zeros(4), first=False, last=False, batch=4)
    # the repeat (80,000 bytes), its sum (1 x 100) and x * 2 (4 x 100) are live together at the add
    assert forward == 50 * 4 * 100 * 4 + 100 * 4 + 4 * 100 * 4


def _layer(name: str, act: float, transient: float) -> dict:
    return {"name": name, "params": 10, "activation_bytes_per_sample": act, "output_bytes_per_sample": 8.0,
            "transient_bytes_per_sample": transient, "forward_s_per_sample": 1e-3, "backward_s_per_sample": 2e-3}


def test_chunk_transient_is_the_largest_beyond_what_later_layers_hold() -> None:
    layers = [LayerSpec(**_layer("a", 100, 500)), LayerSpec(**_layer("b", 100, 50)),
              LayerSpec(**_layer("c", 30, 20))]
    # layer a runs while b and c hold nothing: 500 - (100 + 30); b: 50 - 30; c: 20 (per sample)
    assert chunk_transient_bytes(layers, [1, 3]).tolist() == [370, 1110]
    assert chunk_transient_bytes([LayerSpec(**_layer("a", 10, 0))], [2]).tolist() == [0]


def test_chunk_transient_fixed_part_does_not_grow_with_the_micro_batch() -> None:
    """A fixed part (a weight gradient before accumulation) wins on small micro-batches, the
    per-sample part on large ones: the chunk's transient is the upper envelope of both lines."""
    layers = [LayerSpec(**{**_layer("a", 100, 0), "transient_bytes": 1000}),
              LayerSpec(**_layer("b", 10, 300))]
    # a: 1000 - n x 10 (b's saved bytes), b: 300 n
    assert chunk_transient_bytes(layers, [1, 2, 4, 8]).tolist() == [990, 980, 1200, 2400]


def test_predicted_peak_memory_adds_the_running_pass_transient() -> None:
    """One stage, GPipe, M = 2: both micro-batches' activations are held when the first backward
    starts; the peak is static + 2 x activations + the chunk's transient at 2 samples."""
    table = {"preset": "table", "input_bytes_per_sample": 8.0,
             "layers": [_layer("a", 100, 500), _layer("b", 100, 50)]}
    sc = parse_scenario({"model": table, "hardware": {"preset": "ideal"},
                         "pipeline": {"stages": 1, "micro_batches": 2, "batch_size": 4, "schedule": "gpipe",
                                      "remat": "none", "partition": [2]},
                         "training": {"optimizer": "momentum"}})
    result = simulate(sc)
    stage = result.stages[0]
    static = 20 * 4 + 20 * (4 + 4)  # 20 parameters: the weight; its gradient and momentum buffer
    assert stage.param_bytes + stage.state_bytes == static
    assert stage.peak_activation_bytes == 2 * 200 * 2  # unchanged by transients
    assert stage.peak_memory_bytes == static + 2 * 200 * 2 + (500 - 100) * 2
    assert stage.memory_breakdown["transient"] == 800
    no_transient = parse_scenario({**sc.to_dict(), "model": {**table, "layers": [_layer("a", 100, 0),
                                                                                 _layer("b", 100, 0)]}})
    plain = simulate(no_transient).stages[0]
    assert plain.peak_memory_bytes == plain.param_bytes + plain.state_bytes + plain.peak_activation_bytes


def test_step_buffers_count_receives_sends_and_data() -> None:
    """K = 2, GPipe, M = 2 with `hardware.host.step_buffers`: rank 1 holds both activation receive
    buffers all step and its input gradients from each send on; rank 0 its gradient receive buffers,
    the model input and its sent outputs. A chunk input that its first layer saves is one buffer."""
    table = {"preset": "table", "input_bytes_per_sample": 8.0,
             "layers": [_layer("a", 100, 0), _layer("b", 100, 0)]}
    base = {"model": table, "hardware": {"preset": "ideal"},
            "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 4, "schedule": "gpipe",
                         "remat": "none", "partition": [1, 1]}}
    plain = simulate(parse_scenario(base))
    held = simulate(parse_scenario({**base, "hardware": {"preset": "ideal", "host": {"step_buffers": True}}}))
    from gpipe_sim.plan.memory_timeline import step_buffer_bytes

    plan = compile_plan(parse_scenario({**base, "hardware": {"preset": "ideal", "host": {"step_buffers": True}}}))
    # rank 0: 2 gradient buffers (8 B x 2 samples) + the model input (8 B x 4 samples); rank 1: 2 activation buffers
    assert step_buffer_bytes(plan).tolist() == [2 * 16 + 32, 2 * 16]
    for p, q in zip(plain.stages, held.stages):
        assert q.peak_activation_bytes == p.peak_activation_bytes  # the accounting is untouched
    # rank 0 peaks when its second forward ends its send: both outputs sent (2 x 16) on top; the
    # inputs its two held micro-batches save are the data buffer's (2 x 16, counted once)
    assert held.stages[0].peak_memory_bytes == plain.stages[0].peak_memory_bytes + 64 + 32 - 32
    # rank 1: its received inputs live in the buffers (subtracted from its activations once)
    assert held.stages[1].peak_memory_bytes == plain.stages[1].peak_memory_bytes


def test_validate_shows_measured_memory_and_the_accounting_apart() -> None:
    from gpipe_exec.measure.steps import Measurement
    from gpipe_exec.checks.validate import Validation, validation_text

    sc = parse_scenario({"model": {"preset": "uniform", "layers": 4}, "hardware": {"preset": "ideal"},
                         "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 4}})
    predicted = simulate(sc)
    measured = simulate(sc)
    measured.stages[0].peak_memory_bytes *= 1.1
    v = Validation(sc, predicted, Measurement(measured, [measured.step_time_s], 0.0), None)
    text = validation_text(v)
    assert "stage0.peak_memory_bytes" in text and "stage0.accounting.peak_activation_bytes" in text
    errors = v.relative_error
    assert errors["stage0.peak_memory_bytes"] == pytest.approx(1 - 1 / 1.1)
    assert errors["stage0.accounting.peak_activation_bytes"] == 0.0


@pytest.mark.slow  # a launch (~10-30 s here); tests/test_exec_measure.py checks the same on its runs
def test_a_run_measures_its_memory_apart_from_the_accounting() -> None:
    """A real run (2 ranks): each stage's peak memory is the tracker's, with its parameters,
    gradients and momentum buffers exactly, and not the accounting's static + saved bytes."""
    from gpipe_exec.execute import execute

    sc = parse_scenario({
        "model": {"preset": "transformer", "layers": 2, "d_model": 16, "d_ff": 32, "heads": 2, "seq_len": 8,
                  "vocab": 31},
        "hardware": {"preset": "cpu"},
        "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 4, "schedule": "1f1b", "remat": "none"},
        "training": {"optimizer": "momentum"},
    })
    m = execute(sc, steps=1, warmup=1)
    for stage, accounting in zip(m.result.stages, m.accounting_peak_bytes):
        b = stage.memory_breakdown
        assert b["parameters"] == stage.param_bytes
        assert b["gradients"] == stage.param_bytes and b["optimizer_states"] == stage.param_bytes
        assert stage.peak_memory_bytes == pytest.approx(sum(b.values()))
        assert stage.peak_memory_bytes != accounting
        assert accounting == stage.param_bytes + stage.state_bytes + stage.peak_activation_bytes
    assert set(m.result.device_peak_memory_bytes) == {0, 1}
    assert np.all(np.array(list(m.result.device_peak_memory_bytes.values())) >=
                  np.array([s.peak_memory_bytes for s in m.result.stages]) - 1e-6)


def test_a_tensor_two_adjacent_layers_save_counts_once_in_a_chunk() -> None:
    table = {"preset": "table", "input_bytes_per_sample": 8.0,
             "layers": [_layer("a", 100, 0), {**_layer("b", 100, 0), "saved_with_previous_bytes_per_sample": 30.0}]}
    base = {"model": table, "hardware": {"preset": "ideal"},
            "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 2, "schedule": "gpipe", "remat": "none"}}
    together = compile_plan(parse_scenario({**base, "pipeline": {**base["pipeline"], "partition": [2]}}))
    assert together.chunks[0].activation_bytes.tolist() == [(100 + 100 - 30) * 2]
    apart = compile_plan(parse_scenario({**base, "pipeline": {**base["pipeline"], "stages": 2, "partition": [1, 1]}}))
    assert [c.activation_bytes.tolist() for c in apart.chunks] == [[200], [200]]  # each chunk holds its own
    assert apart.chunks[0].output_saved_bytes.tolist() == [60]  # the first layer saves its output too


def test_profile_records_what_adjacent_layers_save_in_common() -> None:
    from gpipe_exec.profile import ProfileOptions, profile_model, saves_input_output

    x = torch.randn(3, 5)
    assert saves_input_output(torch.nn.Linear(5, 5), x, x, first=False, last=False) == (True, False)
    assert saves_input_output(torch.nn.ReLU(), x, x, first=False, last=False) == (False, True)
    sc = parse_scenario({"model": {"preset": "mlp", "layers": 3, "width": 16, "input_dim": 8, "num_classes": 4},
                         "hardware": {"preset": "cpu"},
                         "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 4}})
    rows = profile_model(sc, ProfileOptions(warmup=0, repeats=1, min_time_s=0.0))["layers"]
    # every Linear + ReLU block saves its input and its output: the next one's input is that output
    assert [r.get("saved_with_previous_bytes_per_sample", 0.0) for r in rows][1:] == [16 * 4] * (len(rows) - 1)


# a profile and a launch: 4 s on a quiet machine, 30 s at load 9
def test_convnet_accounting_stays_exact_and_memory_is_predicted() -> None:
    """The convnet's blocks save their output and the next block its input: one allocation, counted
    once by the executor's accounting and by the simulator (saved_with_previous)."""
    from gpipe_exec.measure.steps import measured_result
    from gpipe_exec.runtime.job import job_for
    from gpipe_exec.launch.spawn import LaunchOptions, launch
    from gpipe_exec.profile import ProfileOptions, profile_model
    from gpipe_exec.checks.rounds import predict_with_profile

    sc = parse_scenario({"model": {"preset": "convnet", "layers": 4, "channels": 8, "image_size": 16,
                                   "num_classes": 3},
                         "hardware": {"preset": "cpu"},
                         "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": 8, "schedule": "1f1b",
                                      "remat": "none"},
                         "training": {"optimizer": "momentum"}})
    table = profile_model(sc, ProfileOptions(warmup=0, repeats=1, min_time_s=0.0))
    _, plan, predicted = predict_with_profile(sc, table, None)
    out = launch([job_for(plan, model=sc.model, steps=1, warmup=1)], plan.device_map,
                 LaunchOptions(comm_timeout_s=60))[0]
    m = measured_result(plan, out)
    for p, q in zip(predicted.stages, m.result.stages):
        assert q.peak_activation_bytes == pytest.approx(p.peak_activation_bytes, rel=1e-9)
        assert p.peak_memory_bytes == pytest.approx(q.peak_memory_bytes, rel=0.10)


def test_transient_fit_splits_a_fixed_part_from_a_part_per_sample() -> None:
    from gpipe_exec.profile import transient_fit

    # backward 1000 + 50 n (a weight gradient and a gradient per sample), forward 20 n
    assert transient_fit(2, (40, 1100), 8, (160, 1400)) == (1000, 50)
    # a forward larger per sample than the backward's slope raises the part per sample
    assert transient_fit(2, (400, 1100), 8, (1600, 1400)) == (1000, 200)
    # a backward that shrinks as the batch grows: its largest, fixed
    assert transient_fit(2, (0, 500), 8, (0, 300)) == (500, 0)
    # a line that would cross below 0 at 0 samples: through 0 and the larger size
    assert transient_fit(2, (0, 100), 8, (0, 800)) == (0, 100)
    # one size: all of it per sample
    assert transient_fit(4, (10, 80), 4, (10, 80)) == (0, 20)


def test_memory_grid_covers_the_documented_cases_and_summarises() -> None:
    from gpipe_exec.checks.memory_grid import StageFigure, grid_cases, main, summary

    cases = grid_cases()
    # two models x (3 schedules x 2 remat x 2 M + 2 chunked + Adam for-loop, foreach, bf16, D=2, D=2 ZeRO-1)
    assert len(cases) == 2 * (3 * 2 * 2 + 2 + 5)
    labels = [label for label, _ in cases]
    assert len(set(labels)) == len(labels)
    zbv = dict(cases)["convnet zbv v=2"]
    assert zbv.pipeline.chunks == 2 and zbv.pipeline.stages == 2
    zero = dict(cases)["transformer 1f1b adam D=2 ZeRO-1"]
    assert (zero.pipeline.data_parallel, zero.training.zero, zero.training.optimizer) == (2, 1, "adam")
    figures = [StageFigure("a", 0, 100.0, 101.0), StageFigure("b", 1, 200.0, 190.0), StageFigure("c", 0, 50.0, 50.0)]
    assert summary(figures) == "3 stage figures: median error 1.00%, worst 5.00% (b, stage 1)"
    assert main(["--models", "resnet"]) == 2


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("step", ["for_loop", "foreach", "fused"])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "rmsprop", "adagrad", "adam", "adamw"])
def test_update_scratch_is_what_torch_allocates(optimizer: str, step: str, dtype: str) -> None:
    """The update's temporaries the simulator charges (OPTIMIZER_SCRATCH x the largest tensor, or
    x every parameter for a foreach step, fp32; in bf16 also an fp32 copy of every gradient for the
    master weights) against the tracker over a steady-state step of the executor's own update;
    what the simulator leaves out is a for-loop step's previous tensor's last temporary, alive
    until the next is made (here a bias: RMSprop's and Adagrad's peak is 1% above)."""
    from gpipe_exec.measure.memory import module_state
    from gpipe_exec.runtime.update import Update
    from gpipe_sim.plan.compile import update_scratch_bytes

    training = {"optimizer": optimizer, "optimizer_step": step, "dtype": dtype}
    if step == "fused" and optimizer == "rmsprop":
        with pytest.raises(ValueError, match="training.optimizer_step: torch has no fused rmsprop"):
            parse_scenario({"training": training})
        return
    scenario = parse_scenario({"training": training, "pipeline": {"stages": 1}})
    model = torch.nn.Sequential(torch.nn.Linear(96, 64), torch.nn.Linear(64, 32)).to(torch.bfloat16 if dtype == "bf16"
                                                                                      else torch.float32)
    update = Update(list(model.parameters()), scenario)
    for _ in range(2):  # the first step makes the states
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        tracker = StorageTracker()
        module_state(tracker, [model], [update.optimizer])
        tracker.track(update.masters, "optimizer_states")
        with tracker:
            tracker.mark()
            before = tracker.total
            update.step()
    layers = [LayerSpec(**{**_layer("a", 0, 0), "params": 96 * 64 + 64, "largest_tensor_params": 96 * 64}),
              LayerSpec(**{**_layer("b", 0, 0), "params": 64 * 32 + 32, "largest_tensor_params": 64 * 32})]
    assert tracker.interval_peak - before == pytest.approx(update_scratch_bytes(scenario, layers), rel=0.015)
    static = tracker.total - before  # nothing left behind
    assert static == 0
    if dtype == "bf16":  # the parameters are the updated masters, rounded
        for master, p in zip(update.masters, model.parameters()):
            assert master.dtype == torch.float32 and p.dtype == torch.bfloat16
            assert torch.equal(master.detach().to(torch.bfloat16), p.detach())


def test_optimizer_step_follows_the_accelerator_unless_given() -> None:
    def step(hardware: str, optimizer: str = "adam", given: str = "default") -> str:
        return parse_scenario({"hardware": {"preset": hardware},
                               "training": {"optimizer": optimizer, "optimizer_step": given}}).optimizer_step

    assert (step("cpu"), step("v100"), step("tpuv3")) == ("for_loop", "fused", "fused")
    assert step("tpuv3", "rmsprop") == "for_loop"  # no fused RMSprop step: the default falls back
    assert step("h100-sxm", "rmsprop") == "foreach"  # torch's on CUDA
    assert step("v100", given="fused") == "fused"


@pytest.mark.parametrize("model", [
    {"preset": "convnet", "layers": 4, "channels": 8, "image_size": 16, "num_classes": 5},
    {"preset": "transformer", "layers": 3, "d_model": 32, "d_ff": 64, "heads": 2, "seq_len": 8, "vocab": 50},
])
def test_input_pass_of_a_chunk_from_its_layers_is_exact(model: dict) -> None:
    """A chunk's input-gradient pass holds, above its start, max over its layers j of (j's own pass
    + what the layers after j keep for the weight pass): against the tracker on the zoo's chunks,
    from the profiler's per-layer figures (`input_pass_bytes`, `split_saved_bytes`)."""
    from gpipe_exec.profile import input_pass_memory, split_saved_bytes
    from gpipe_exec.zoo import build_layer, make_batch
    from gpipe_sim.plan.compile import input_pass_bytes as chunk_input_pass
    from gpipe_sim.model.layers import layer_count

    spec = parse_scenario({"model": model, "hardware": {"preset": "cpu"},
                           "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": 4}}).model
    b = 4
    x, y = make_batch(spec, b)
    n = layer_count(spec)
    modules = [build_layer(spec, i) for i in range(n)]
    inputs = [x]
    with torch.no_grad():
        for m in modules[:-1]:
            inputs.append(m(inputs[-1]))
    rows = [LayerSpec(name=f"l{i}", forward_s_per_sample=1e-3, backward_s_per_sample=1e-3,
                      input_pass_bytes_per_sample=input_pass_memory(
                          modules[i], inputs[i], y, last=i == n - 1, batch=b).peak / b,
                      kept_for_weight_bytes_per_sample=split_saved_bytes(modules[i], inputs[i])["kept_gradients"] / b)
            if i else None for i in range(n)]  # the model's first layer takes no input gradient
    checked = 0
    for first in range(1, n):
        for last in range(first + 1, n + 1):
            chunk = torch.nn.Sequential(*modules[first:last])
            measured = input_pass_memory(chunk, inputs[first], y, last=last == n, batch=b).peak
            # to the loss's 4 B
            assert chunk_input_pass(rows[first:last]) * b == pytest.approx(measured, abs=16), (first, last)
            checked += 1
    assert checked >= 3


def test_recomputed_output_is_held_from_the_recompute_to_its_backward() -> None:
    """Under step buffers, a re-computation's output (a new tensor, the backward's root) is held to
    the end of its backward: all of it where the chunk sends its output (the forward's sent tensor
    stands for what the last layer saves), none on the model's last chunk."""
    from gpipe_sim.plan.memory_timeline import recomputed_output_deltas
    from gpipe_sim.schedule import Kind

    def scenario(step_buffers: bool, remat: str = "always"):
        return parse_scenario({
            "model": {"preset": "table", "input_bytes_per_sample": 8.0,
                      "layers": [_layer("a", 100, 0), _layer("b", 100, 0), _layer("c", 100, 0)]},
            "hardware": {"preset": "ideal", "host": {"step_buffers": step_buffers}},
            "pipeline": {"stages": 3, "micro_batches": 2, "batch_size": 4, "schedule": "gpipe", "remat": remat}})

    plan = compile_plan(scenario(True))
    alloc, free = recomputed_output_deltas(plan)
    prog = plan.program
    for i in range(len(prog.kind)):
        c = int(prog.chunk[i])
        if prog.kind[i] in (int(Kind.RECOMPUTE), int(Kind.BACKWARD)) and c < 2:
            held = 8.0 * 2  # output bytes per sample x 2 samples a micro-batch
            assert (alloc[i] if prog.kind[i] == int(Kind.RECOMPUTE) else free[i]) == held
        else:
            assert alloc[i] == 0 and free[i] == 0, (i, prog.kind[i], c)
    for sc in (scenario(False), scenario(True, remat="none")):
        assert not any(d.any() for d in recomputed_output_deltas(compile_plan(sc)))


def test_what_only_the_input_pass_reads_goes_when_it_ends() -> None:
    """zb_h1: in the memory in all, a micro-batch's saved bytes leave in two parts, what only its
    input pass reads at that pass's end, the rest at its weight pass's end; nothing early on the
    model's first chunk, whose input pass does nothing. The held activations (the accounting)
    keep all of them to the weight pass's end."""
    from gpipe_sim.plan.memory_timeline import activation_deltas, freed_after_input_deltas
    from gpipe_sim.schedule import Kind

    def layer(name: str, freed: float) -> dict:
        return {**_layer(name, 100, 0), "freed_after_input_pass_bytes_per_sample": freed}

    def scenario(freed: tuple[float, float, float]):
        return parse_scenario({
            "model": {"preset": "table", "input_bytes_per_sample": 8.0,
                      "layers": [layer(n, f) for n, f in zip("abc", freed)]},
            "hardware": {"preset": "ideal"},
            "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 4, "schedule": "zb_h1", "remat": "none",
                         "partition": [1, 2]}})

    plan = compile_plan(scenario((30, 40, 60)))
    early = freed_after_input_deltas(plan)
    _, free = activation_deltas(plan)
    prog = plan.program
    for i, (kind, c) in enumerate(zip(prog.kind.tolist(), prog.chunk.tolist())):
        if kind == int(Kind.BACKWARD_INPUT):
            assert (free[i], early[i]) == (0, 0 if c == 0 else -(40 + 60) * 2), (i, c)
        elif kind == int(Kind.BACKWARD_WEIGHT):
            assert (free[i], early[i]) == ((100 * 2, 0) if c == 0 else (200 * 2, (40 + 60) * 2)), (i, c)
        else:
            assert early[i] == 0
    # rank 1 (static 320 B) runs F0 I0 F1 I1 W0 W1: it holds both micro-batches' 400 B each,
    # unless I0 has let 200 B of the first go: 600 B at F1's start; the accounting holds 800 B
    early_result, held_result = simulate(scenario((30, 40, 60))), simulate(scenario((0, 0, 0)))
    assert early_result.stages[1].peak_activation_bytes == held_result.stages[1].peak_activation_bytes == 800
    assert (early_result.stages[1].peak_memory_bytes, held_result.stages[1].peak_memory_bytes) == (320 + 600, 320 + 800)
    with pytest.raises(ValueError, match="freed_after_input_pass_bytes_per_sample exceeds"):
        LayerSpec(**layer("d", 101))


def test_a_meter_counts_what_a_nested_pair_of_hooks_packs() -> None:
    """An inner pair of saved-tensor hooks (a GEMM keeping half its input) composes with the meter's
    instead of hiding it: the meter counts the half, and the backward sees the whole again."""
    from gpipe_exec.measure.saved_hooks import nested_saved_tensors_hooks

    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    unpacked: list[int] = []

    def halve(t: torch.Tensor) -> torch.Tensor:
        return t[:2].clone() if t is x else t

    def restore(t: torch.Tensor) -> torch.Tensor:
        if t.shape == (2, 8):
            unpacked.append(t.numel())
            return torch.cat([t, x[2:]])
        return t

    meter = SavedBytesMeter([])
    with meter.track(0):
        with nested_saved_tensors_hooks(halve, restore):
            y = x @ w  # saves x alone (for w's gradient)
    assert meter.peak == 2 * 8 * 4  # half of x, as the inner pair packed it
    y.sum().backward()
    assert unpacked == [16]
    torch.testing.assert_close(w.grad, x.sum(0)[:, None].expand(8, 8))
