"""Training frameworks' configurations (issue 36, items 2 and 3): a scenario written as Megatron-LM
arguments, a torchtitan job TOML or a DeepSpeed JSON file, and Megatron-LM arguments and torchtitan
TOML files read back; write-then-read gives back the planner's picks."""

from __future__ import annotations

import json
import tomllib

import pytest

from gpipe_sim.cli import main
from gpipe_sim.frameworks.common import chunk_sizes
from gpipe_sim.frameworks.megatron import layout_sizes, layout_text, write_megatron
from gpipe_sim.frameworks.megatron_read import read_megatron
from gpipe_sim.frameworks.torchtitan import module_parts, write_torchtitan
from gpipe_sim.frameworks.torchtitan_read import read_torchtitan
from gpipe_sim.planner.search import PlanOptions, search_configurations
from gpipe_sim.scenario.scenario import Scenario, parse_scenario


def _model(layers: int, d: int, heads: int) -> dict:
    return {"preset": "transformer", "layers": layers, "d_model": d, "d_ff": 4 * d, "heads": heads,
            "seq_len": 128, "vocab": 1000}


MODELS = {"gpt-8x256": _model(8, 256, 4),
          # Llama-style blocks: grouped-query attention, SwiGLU, RMSNorm, rotary positions, no biases
          "llama-12x512": {**_model(12, 512, 8), "kv_heads": 2, "mlp": "swiglu", "norm": "rmsnorm",
                           "position": "rope", "bias": False, "tied_embeddings": True}}
# adamw: Megatron-LM's adam decouples weight decay
BASE = {"hardware": {"preset": "a100-80gb", "devices_per_node": 8},
        "pipeline": {"batch_size": 16}, "training": {"dtype": "bf16", "optimizer": "adamw"}}


def _base(model: str) -> Scenario:
    return parse_scenario({**BASE, "model": MODELS[model]})


def _shape(s: Scenario) -> dict:
    """What a framework's configuration states: the model, the layout with each chunk's layers,
    the batches, the schedule where there is a pipeline, remat and the training numerics."""
    p, t = s.pipeline, s.training
    return {"model": s.model.model_dump(), "T": p.tensor_parallel, "K": p.stages, "v": p.chunks,
            "D": p.data_parallel, "M": p.micro_batches, "batch": p.batch_size,
            "sp": p.sequence_parallel and p.tensor_parallel > 1, "schedule": p.schedule if p.stages > 1 else None,
            "remat": p.remat, "chunks": chunk_sizes(s), "dtype": t.dtype, "optimizer": t.optimizer, "zero": t.zero,
            "tokens": t.tokens, "overlap": (t.overlap_grad_reduce, t.bucket_bytes, t.overlap_param_gather)}


def _picks(model: str, devices: int, schedules: tuple[str, ...], zero: tuple[int, ...],
           remat: tuple[str, ...]) -> list[Scenario]:
    """The configurations the planner simulated for the question (its ranking's candidates), at most
    16, and as many of its space (what the bounds leave to simulate varies with them)."""
    base = _base(model).with_updates({"training.tokens": 16 * 128 * 1000})  # whole steps and samples
    options = PlanOptions(devices=devices, schedules=schedules, zero=zero, remat=remat,
                          partitions=("uniform", "time"), max_chunks=2, stages=(1, 2, 4), tensor_parallel=(1, 2),
                          even_micro_batches=True, sequence_parallel=True, top=8)
    search = search_configurations(base, options)
    simulated = search.simulated_entries
    space = search.candidates
    overrides = ([e.overrides for e in simulated[::max(1, len(simulated) // 16)]]
                 + [c.overrides() for c in space[::max(1, len(space) // 16)]])
    return [search.base.with_updates(o) for o in overrides]


def _megatron_runs(s: Scenario) -> bool:
    """Megatron-LM runs 1F1B at v = 1 and interleaved 1F1B at v > 1 (not torch's interleaved
    schedule at v = 1, which warms up twice as deep)."""
    p = s.pipeline
    return p.stages == 1 or p.schedule == ("1f1b" if p.chunks == 1 else "interleaved_1f1b")


ROUND_TRIPS = [("megatron", write_megatron, read_megatron, ("1f1b", "interleaved_1f1b"), (0, 1),
                ("none", "always"), _megatron_runs),
               ("torchtitan", write_torchtitan, read_torchtitan, ("gpipe", "1f1b", "interleaved_1f1b", "zbv"), (0, 3),
                ("none", "selective"), lambda s: s.pipeline.data_parallel > 1 or s.training.zero == 0)]


@pytest.mark.parametrize("framework, write, read, schedules, zero, remat, runs", ROUND_TRIPS,
                         ids=[r[0] for r in ROUND_TRIPS])
def test_write_then_read_gives_back_the_planners_picks(framework, write, read, schedules, zero, remat, runs):
    seen = set()
    for model in MODELS:
        for devices in (4, 8):
            for scenario in filter(runs, _picks(model, devices, schedules, zero, remat)):
                written = write(scenario)
                back = read(written.text, _base(model))
                assert _shape(back.scenario) == _shape(scenario), (framework, written.text)
                p = scenario.pipeline
                seen.add((p.stages > 1, p.chunks > 1, p.tensor_parallel > 1, p.data_parallel > 1, p.remat))
    covered = [any(s[i] for s in seen) for i in range(4)]
    assert all(covered), f"the grid's picks never had a pipeline, v > 1, T > 1 or D > 1: {seen}"


@pytest.mark.parametrize("framework, write, read, remat", [
    *(("megatron", write_megatron, read_megatron, mode) for mode in ("none", "always", "full", "selective")),
    *(("torchtitan", write_torchtitan, read_torchtitan, mode) for mode in ("none", "full", "selective"))])
def test_each_remat_mode_the_framework_has_comes_back(framework, write, read, remat):
    scenario = _base("llama-12x512").with_updates({"pipeline.stages": 2, "pipeline.tensor_parallel": 2,
                                                 "pipeline.sequence_parallel": True, "pipeline.micro_batches": 4,
                                                 "pipeline.schedule": "1f1b", "pipeline.remat": remat})
    assert _shape(read(write(scenario).text, _base("llama-12x512")).scenario) == _shape(scenario)


@pytest.mark.parametrize("preset", ["llama3-8b", "gpt3-175b"])
def test_published_architectures_come_back(preset):
    scenario = parse_scenario({**BASE, "model": {"preset": preset, "seq_len": 4096},
                               "pipeline": {"stages": 8, "tensor_parallel": 8, "sequence_parallel": True,
                                            "batch_size": 64, "micro_batches": 16, "schedule": "1f1b",
                                            "remat": "full"}})
    base = parse_scenario({**BASE, "model": {"preset": "transformer"}})
    assert _shape(read_megatron(write_megatron(scenario).text, base).scenario) == _shape(scenario)
    if preset.startswith("llama3"):  # torchtitan's registered llama3 flavors: the model comes back by name
        written = write_torchtitan(scenario)
        assert '[model]\nname = "llama3"\nflavor = "8B"' in written.text
        assert _shape(read_torchtitan(written.text, base).scenario) == _shape(scenario)


def test_layout_strings_parse_as_megatron_unrolls_them():
    assert layout_text((3, 2, 2, 3)) == "Et*2|t*2|t*2|t*2L"
    assert layout_sizes("Et*2|t*2|t*2|t*2L") == (3, 2, 2, 3)
    assert layout_sizes("E|(tt|)*3,L") == (1, 2, 2, 2, 1)  # Megatron-LM's own example form
    assert layout_text((1, 4, 1)) == "E|t*4|L"


def test_module_parts_name_torchtitans_modules():
    assert module_parts((2, 1, 2)) == [["tok_embeddings", "layers.0"], ["layers.1"], ["layers.2", "norm", "output"]]


# Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh with its variables filled in
GPT3_175B = """
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nproc_per_node 8 --nnodes 16 --master_addr localhost --master_port 29500 pretrain_gpt.py \\
    --num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 \\
    --max-position-embeddings 2048 --attention-backend auto \\
    --micro-batch-size 1 --global-batch-size 1536 --train-iters 500000 --weight-decay 0.1 \\
    --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 --clip-grad 1.0 --fp16 \\
    --lr 6.0e-5 --lr-decay-style cosine --min-lr 6.0e-6 --lr-warmup-fraction .001 --lr-decay-iters 430000 \\
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 \\
    --data-path /data/gpt_text_document --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --split 949,50,1
"""


def test_reads_megatrons_gpt3_example():
    read = read_megatron(GPT3_175B, parse_scenario({"hardware": {"preset": "a100-80gb"}}))
    s = read.scenario
    p = s.pipeline
    assert (p.tensor_parallel, p.stages, p.data_parallel, p.chunks) == (8, 16, 1, 1)  # 128 GPUs = 8 x 16 x 1
    assert (p.batch_size, p.micro_batches, p.schedule, p.remat) == (1536, 1536, "1f1b", "none")
    m = s.model
    assert (m.layers, m.d_model, m.d_ff, m.heads, m.seq_len) == (96, 12288, 4 * 12288, 96, 2048)
    assert s.training.dtype == "fp16" and s.training.tokens == 500000 * 1536 * 2048
    assert chunk_sizes(s) == (7,) + (6,) * 14 + (7,)  # 96 layers evenly, the embedding and head at the ends
    text = "\n".join(read.notes)
    for flag in ("--lr 6.0e-5", "--weight-decay 0.1", "--data-path", "--master_addr localhost", "--split 949,50,1"):
        assert flag in text
    assert "'export'" in text and "--vocab-size" in text
    assert m.tied_embeddings and m.bias and (m.mlp, m.norm, m.position, m.kv_heads) == ("gelu", "layernorm", "learned",
                                                                                     None)  # Megatron's defaults


# torchtitan's torchtitan/models/llama3/train_configs/llama3_8b.toml, trimmed, on its debug flavor, with PP and TP
LLAMA3_TOML = """
[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"

[model]
name = "llama3"
flavor = "debugmodel"

[optimizer]
name = "AdamW"
lr = 3e-4

[training]
local_batch_size = 8
global_batch_size = 32
seq_len = 256
steps = 1000

[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = 1
tensor_parallel_degree = 2
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "Interleaved1F1B"
pipeline_parallel_microbatch_size = 2
module_fqns_per_model_part = [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3"], ["layers.4", "layers.5"], ["layers.6", "layers.7", "norm", "output"]]

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""


def test_reads_a_torchtitan_job():
    read = read_torchtitan(LLAMA3_TOML, _base("gpt-8x256"))
    p = read.scenario.pipeline
    assert (p.data_parallel, p.tensor_parallel, p.stages, p.chunks) == (2, 2, 2, 2)
    # 32 / (8 x 2 replicas) = 2 accumulated steps, each of 8 / 2 = 4 micro-batches
    assert (p.batch_size, p.micro_batches, p.schedule, p.sequence_parallel) == (32, 8, "interleaved_1f1b", True)
    assert chunk_sizes(read.scenario) == (3, 2, 2, 3) and read.scenario.model.seq_len == 256
    assert read.scenario.training.tokens == 1000 * 32 * 256
    text = "\n".join(read.notes)
    assert read.scenario.pipeline.remat == "selective"
    for key in ("[job] dump_folder", "[optimizer] lr", "activation_checkpoint.mode selective",
                "[model] llama3 debugmodel: not a flavor", "2 accumulated steps"):
        assert key in text, text


def test_emit_prints_a_file_the_framework_parses(capsys):
    assert main(["simulate", "--emit", "torchtitan", "--set", "pipeline.schedule=1f1b"]) == 0
    out = capsys.readouterr()
    job = tomllib.loads(out.out)
    assert job["parallelism"]["pipeline_parallel_schedule"] == "1F1B" and job["training"]["global_batch_size"] == 64
    assert "gpipe-sim: note: [model]" in out.err
    assert main(["simulate", "--emit", "deepspeed"]) == 0
    out = capsys.readouterr()
    config = json.loads(out.out)
    assert config["train_batch_size"] == config["train_micro_batch_size_per_gpu"] * config[
        "gradient_accumulation_steps"]  # D = 1
    assert "PipelineModule(num_stages=4)" in out.err


def test_what_megatron_cannot_express_is_one_note_each():
    s = _base("gpt-8x256").with_updates({"pipeline.stages": 2, "pipeline.schedule": "gpipe", "pipeline.micro_batches": 3,
                                        "pipeline.remat": "except_last", "training.optimizer": "rmsprop"})
    notes = write_megatron(s).notes
    assert len(notes) == 4 and all("\n" not in n for n in notes)
    assert [n.split(":")[0] for n in notes] == ["pipeline.micro_batches", "pipeline.schedule", "pipeline.remat",
                                                "training.optimizer"]


def test_read_command_prints_the_scenario_and_its_notes(capsys, tmp_path):
    path = tmp_path / "args.txt"
    path.write_text("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --num-layers 8 --hidden-size 256 "
                    "--num-attention-heads 4 --seq-length 128 --vocab-size 1000 --micro-batch-size 2 "
                    "--global-batch-size 16 --bf16 --lr 1e-4\n")
    assert main(["read", "megatron", str(path), "--set", "pipeline.remat=none"]) == 0
    out = capsys.readouterr()
    s = parse_scenario(__import__("yaml").safe_load(out.out))
    assert (s.pipeline.stages, s.pipeline.micro_batches, s.model.layers, s.training.dtype) == (2, 8, 8, "bf16")
    assert "gpipe-sim: note: ignored flag --lr 1e-4" in out.err


@pytest.mark.parametrize("text, fragment", [
    ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'E|tL'", "--pipeline-model-parallel-layout"),
    ("--global-batch-size 10 --micro-batch-size 4", "--global-batch-size 10"),
    ("--tensor-model-parallel-size two", "--tensor-model-parallel-size: expected a whole number"),
])
def test_bad_megatron_arguments_are_one_line(capsys, tmp_path, text, fragment):
    path = tmp_path / "args.sh"
    path.write_text(text)
    assert main(["read", "megatron", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_plan_emits_its_pick(capsys):
    assert main(["plan", "--devices", "4", "--quiet", "--emit", "megatron", "--schedules", "1f1b",
                 "--tensor-parallel", "1", "--partitions", "uniform"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("torchrun --nnodes 1 --nproc-per-node 4 pretrain_gpt.py \\\n")
    assert out.err.startswith("gpipe-sim: note: the pick: T=1, ")


@pytest.mark.parametrize("argv", [["simulate", "--emit", "megatron", "--json"],
                                  ["plan", "--devices", "4", "--emit", "deepspeed", "--json"]])
def test_emit_with_json_is_refused(capsys, argv):
    assert main(argv) == 2
    assert "--emit:" in capsys.readouterr().err


@pytest.mark.parametrize("framework", ["megatron", "torchtitan"])
def test_a_model_without_sizes_is_noted_not_invented(capsys, framework):
    assert main(["simulate", "--emit", framework, "--set", "model.preset=uniform"]) == 0
    out = capsys.readouterr()
    assert "model: a uniform model is not a transformer" in out.err
    assert "--num-layers" not in out.out and "--pipeline-model-parallel-layout" not in out.out
    assert "module_fqns_per_model_part" not in out.out


@pytest.mark.parametrize("bucket, gather", [(None, False), (2 * 10_000_000, True)])
def test_megatrons_overlapped_reduction_comes_back(bucket, gather):
    scenario = _base("gpt-8x256").with_updates({"pipeline.data_parallel": 2, "pipeline.schedule": "1f1b",
                                                "training.overlap_grad_reduce": True, "training.zero": 1,
                                                "training.bucket_bytes": bucket, "training.overlap_param_gather": gather})
    written = write_megatron(scenario)
    assert "--overlap-grad-reduce" in written.text and ("--ddp-bucket-size 10000000" in written.text) == bool(bucket)
    assert ("--overlap-param-gather" in written.text) == gather
    assert _shape(read_megatron(written.text, _base("gpt-8x256")).scenario) == _shape(scenario)


@pytest.mark.parametrize("flags, sizes", [
    ("", (3, 2, 2, 3)),  # 8 layers evenly over 4 stages, the embedding and the output layer at the ends
    ("--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 1", (2, 3, 3, 2)),
    ("--decoder-first-pipeline-num-layers 2", (3, 2, 2, 3)),
    ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split --num-layers 10",
     (3, 3, 3, 3)),  # 10 layers + E + L = 12, three a stage
])
def test_megatrons_split_without_a_layout(flags, sizes):
    line = ("--num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --vocab-size 1000 "
            f"--pipeline-model-parallel-size 4 --global-batch-size 16 --micro-batch-size 1 {flags}")
    read = read_megatron(line, _base("gpt-8x256"))
    assert chunk_sizes(read.scenario) == sizes and not [n for n in read.notes if "partition" in n], read.notes


def test_recompute_activations_is_selective():
    read = read_megatron("--recompute-activations", _base("gpt-8x256"))
    assert read.scenario.pipeline.remat == "selective"


@pytest.mark.parametrize("framework, write, read", [("megatron", write_megatron, read_megatron),
                                                    ("torchtitan", write_torchtitan, read_torchtitan)])
def test_the_pick_read_back_simulates_to_the_planners_step_time(framework, write, read):
    from gpipe_sim.api import simulate

    base = _base("llama-12x512")
    options = PlanOptions(devices=8, schedules=("1f1b",), zero=(0,), remat=("none", "full"), partitions=("time",),
                          tensor_parallel=(1, 2), stages=(2, 4), even_micro_batches=True, sequence_parallel=True, top=1)
    search = search_configurations(base, options)
    back = read(write(search.base.with_updates(search.pick.overrides)).text, base).scenario
    assert simulate(back, "fast").step_time_s == pytest.approx(search.pick.step_time_s, rel=1e-12)
