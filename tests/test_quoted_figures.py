"""The figures people quote (issue 26): parameters, tokens/s, achieved model TFLOP/s per device and
MFU, defined once in the result schema and shown by simulate, plan, sweeps and the executor's result;
and what the README and the user guide quote: every command output they show is what the command
prints today, and every command they give parses."""

from __future__ import annotations

import csv
import json
import math
import re

import pytest
import yaml

from gpipe_sim.api import model_figures, simulate
from gpipe_sim.cli import main
from gpipe_sim.results.result import ModelFigures, Result
from gpipe_sim.scenario.scenario import parse_scenario
from gpipe_sim.summary import parameters_short, summary_text
from user_docs import ROOT, fenced_commands, program_argv, quoted_outputs, user_docs

KEYS = ("parameters", "tokens_per_s", "tflops_per_device", "mfu")
L, D_MODEL, D_FF, HEADS, SEQ, VOCAB, BATCH = 4, 256, 1024, 4, 128, 1000, 8
TRANSFORMER = {
    "model": {"preset": "transformer", "layers": L, "d_model": D_MODEL, "d_ff": D_FF, "heads": HEADS,
              "seq_len": SEQ, "vocab": VOCAB},
    "hardware": {"preset": "a100-80gb"},
    "pipeline": {"stages": 2, "micro_batches": 4, "batch_size": BATCH, "schedule": "1f1b", "remat": "none"},
    "training": {"dtype": "bf16"},
}


def _scenario(data=TRANSFORMER, **updates):
    return parse_scenario(data).with_updates(updates)


# The rows the embedding table and the output head have: VOCAB rounded up to a multiple of 128
# (model.vocab_multiple's default, as Megatron-LM's --make-vocab-size-divisible-by pads it), so
# 1000 -> 1024. The padded rows are parameters and run in the head's GEMM (Megatron counts its
# FLOPs with the padded vocabulary too), though no target ever names them.
PADDED_VOCAB = 1024


def _hand_parameters(d=D_MODEL, f=D_FF, s=SEQ, v=PADDED_VOCAB, layers=L):
    embedding = v * d + s * d  # token and position tables
    block = (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d  # QKV, proj, MLP, 2 LNs
    head = 2 * d + d * v  # final LayerNorm and the (untied) output projection
    return embedding + layers * block + head


def _hand_forward_flops_per_sample(d=D_MODEL, f=D_FF, s=SEQ, v=PADDED_VOCAB, layers=L):
    """Megatron-LM's count: the GEMMs and the causal half of QK^T and of the context; no norms,
    no position add."""
    block = 2 * s * (4 * d * d + 2 * d * f) + 2 * s * s * d
    return layers * block + 2 * s * d * v  # the blocks, the head


def test_transformer_parameters_are_the_hand_count():
    result = simulate(_scenario())
    assert result.parameters == _hand_parameters()
    assert result.parameters == sum(s.param_bytes for s in result.stages) / 2  # bf16 weights, one replica


def test_vocab_padding_sizes_the_tables_and_can_be_turned_off():
    """vocab_multiple (default 128) pads the embedding and head rows; 1 keeps the vocabulary as is;
    0, or a padding beyond the dimension limit, is refused."""
    from gpipe_sim.errors import ScenarioError
    from gpipe_sim.model.model import TransformerModel

    assert _scenario().model.padded_vocab == PADDED_VOCAB
    assert TransformerModel(vocab=50257).padded_vocab == 50304  # GPT-2's, as Megatron and nanoGPT run it
    assert TransformerModel(vocab=50304).padded_vocab == 50304 and TransformerModel(vocab=1).padded_vocab == 128
    unpadded = simulate(_scenario(**{"model.vocab_multiple": 1}))
    assert unpadded.parameters == _hand_parameters(v=VOCAB)
    assert unpadded.figures.model_flops_per_step == pytest.approx(3 * BATCH * _hand_forward_flops_per_sample(v=VOCAB))
    for bad in (0, -128, 10**10):
        with pytest.raises((ScenarioError, ValueError)):
            parse_scenario({**TRANSFORMER, "model": {**TRANSFORMER["model"], "vocab_multiple": bad}})
    with pytest.raises((ScenarioError, ValueError), match="limit"):
        parse_scenario({**TRANSFORMER, "model": {**TRANSFORMER["model"], "vocab": 10**9 - 1, "vocab_multiple": 7}})


def test_transformer_tokens_tflops_and_mfu_formulas():
    for updates in ({}, {"pipeline.data_parallel": 2}, {"pipeline.remat": "always"}):
        result = simulate(_scenario(**updates))
        step, devices = result.step_time_s, result.num_devices
        assert devices == 2 * updates.get("pipeline.data_parallel", 1)
        flops = 3 * BATCH * _hand_forward_flops_per_sample()  # forward + backward (2x), no re-computation
        assert result.figures.model_flops_per_step == pytest.approx(flops, rel=1e-12)
        assert result.tokens_per_s == pytest.approx(BATCH * SEQ / step, rel=1e-12)
        assert result.tflops_per_device == pytest.approx(flops / step / devices / 1e12, rel=1e-12)
        assert result.mfu == pytest.approx(flops / (step * devices * 312.0e12), rel=1e-12)  # A100 bf16 peak
        assert 0 < result.mfu < 0.6  # under the preset's efficiency


def test_re_computation_is_not_model_flops():
    """Same model FLOPs with and without re-computation: the slower step has the lower MFU."""
    plain, remat = simulate(_scenario()), simulate(_scenario(**{"pipeline.remat": "always"}))
    assert plain.figures == remat.figures
    assert remat.step_time_s > plain.step_time_s and remat.mfu < plain.mfu


def test_peak_is_the_training_dtypes():
    fp32 = simulate(_scenario(**{"training.dtype": "fp32"}))
    assert fp32.figures.peak_flops_per_device == 19.5e12
    only_fp32 = _scenario(**{"hardware.accelerator.peak_flops": {"fp32": 10e12}})  # bf16 has none: the highest
    assert model_figures(only_fp32).peak_flops_per_device == 10e12


def test_models_without_tokens_or_flops():
    mlp = simulate(parse_scenario({"model": {"preset": "mlp", "layers": 4}, "hardware": {"preset": "v100"},
                                   "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 8}}))
    assert mlp.tokens_per_s is None and mlp.mfu is not None and mlp.tflops_per_device > 0
    scenario = parse_scenario({"model": {"preset": "uniform", "layers": 4, "params_per_layer": 1000},
                               "pipeline": {"stages": 2, "micro_batches": 2, "batch_size": 8}})
    uniform = simulate(scenario)
    assert uniform.parameters == 4000  # timed in seconds: no FLOPs, no TFLOP/s, no MFU
    assert uniform.tokens_per_s is None and uniform.tflops_per_device is None and uniform.mfu is None
    text = summary_text(scenario, uniform)
    assert "a layer gives no FLOPs" in text and "not a token model" in text and "MFU" in text


def test_figures_are_finite_or_none():
    figures = ModelFigures(parameters=10, model_flops_per_step=1e30, tokens_per_step=5, peak_flops_per_device=1.0)
    assert figures.rates(0.0, 1) == {"parameters": 10, "tokens_per_s": None, "tflops_per_device": None, "mfu": None,
                                     "mfu_palm": None}
    assert figures.rates(1e-320, 1)["mfu"] is None  # would overflow to inf
    assert ModelFigures(parameters=1, model_flops_per_step=math.inf).to_dict()["model_flops_per_step"] is None


def test_json_keys_and_round_trip():
    result = simulate(_scenario())
    data = json.loads(result.to_json(timeline=False))
    for key in KEYS:
        assert data[key] == getattr(result, key)
    assert data["model_flops_per_step"] > 0 and data["tokens_per_step"] == BATCH * SEQ
    again = Result.from_dict(data)
    assert again.figures == result.figures and again.mfu == result.mfu
    old = {k: v for k, v in data.items() if k not in (*KEYS, "model_flops_per_step", "tokens_per_step",
                                                      "peak_flops_per_device")}
    before = Result.from_dict(old)  # a file written before these figures
    assert before.figures is None and all(before.to_dict(False)[k] is None for k in KEYS)


def test_simulate_command_summary_and_json(capsys, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(TRANSFORMER))
    assert main(["simulate", str(path)]) == 0
    out = capsys.readouterr().out
    for label in ("parameters", "tokens/s", "TFLOP/s per device", "MFU", "re-computation not counted"):
        assert label in out
    assert f"({_hand_parameters():,})" in out
    assert main(["simulate", str(path), "--json", "--no-timeline"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parameters"] == _hand_parameters()
    assert all(isinstance(data[k], (int, float)) for k in KEYS)


def test_sweep_columns():
    from gpipe_sim.sweeps.runner import RESULT_COLUMNS, result_columns

    row = result_columns(_scenario(), "auto")
    assert set(KEYS) <= set(row) and set(KEYS) <= set(RESULT_COLUMNS)
    result = simulate(_scenario())
    assert row["parameters"] == _hand_parameters() and row["mfu"] == pytest.approx(result.mfu, rel=1e-12)


def test_plan_table_csv_and_json(capsys, tmp_path):
    path, csv_path = tmp_path / "s.yaml", tmp_path / "p.csv"
    path.write_text(yaml.safe_dump(TRANSFORMER))
    argv = ["plan", str(path), "--devices", "2", "--schedules", "1f1b", "--top", "3"]
    assert main([*argv, "--csv", str(csv_path)]) == 0
    out = capsys.readouterr().out
    assert "MFU" in out and "TFLOP/s/dev" in out and f"{_hand_parameters():,} parameters" in out
    rows = list(csv.DictReader(csv_path.open()))
    assert rows and all(k in rows[0] for k in KEYS)
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parameters"] == _hand_parameters()
    for entry in data["ranked"]:
        flops = data["model_flops_per_step"]
        assert entry["parameters"] == _hand_parameters()
        assert entry["tokens_per_s"] == pytest.approx(BATCH * SEQ / entry["step_time_s"], rel=1e-12)
        assert entry["mfu"] == pytest.approx(flops / (entry["step_time_s"] * entry["devices"] * 312.0e12), rel=1e-12)


def test_parameters_short():
    assert [parameters_short(n) for n in (800, 12_500, 350_000_000, 1_341_771_776, 999_999)] == [
        "800", "12.5K", "350M", "1.34B", "1M"]


QUOTED = [quoted for page in user_docs() for quoted in quoted_outputs(page)]


def _printed(command: str, capsys, monkeypatch) -> list[str]:
    """What a gpipe-sim command prints (stdout, then stderr), run from the repository root."""
    program, argv = program_argv(command) or (None, [])
    assert program == "gpipe-sim", f"only gpipe-sim outputs are checked here: {command}"
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    main(argv)
    captured = capsys.readouterr()
    return [line.rstrip() for line in (captured.out + captured.err).strip("\n").split("\n")]


@pytest.mark.parametrize("quoted", QUOTED, ids=[f"{q.page}: {q.command}" for q in QUOTED])
def test_quoted_outputs_are_what_the_commands_print(quoted, capsys, monkeypatch):
    printed = _printed(quoted.command, capsys, monkeypatch)
    if not quoted.excerpt:
        assert list(quoted.lines) == printed, f"{quoted.page} quotes an output `{quoted.command}` no longer prints"
        return
    rest = iter(printed)  # an excerpt: its lines appear in the output, in order
    missing = [line for line in quoted.lines if line != "..." and not any(line == p for p in rest)]
    assert not missing, f"{quoted.page}: `{quoted.command}` no longer prints {missing}"


def test_the_drifted_figures_are_quoted(capsys, monkeypatch):
    """The outputs the guide must quote (the README's max-model figure and the paper's tables had
    drifted from what the commands print): a page dropping its marker fails here."""
    commands = {q.command for q in QUOTED}
    assert {"gpipe-sim max-model scenarios/default.yaml --grow layers", "gpipe-sim paper --markdown"} <= commands


def test_output_markers_are_read():
    page = ROOT / "docs" / "guide" / "max-model.md"
    (quoted,) = [q for q in quoted_outputs(page) if "max-model" in q.command]
    assert quoted.lines[0].startswith("largest model.layers that fits:") and not quoted.excerpt


def _parser(program: str):
    if program == "gpipe-sim":
        from gpipe_sim.cli import _load_extra_commands, build_parser

        _load_extra_commands()
        return build_parser()
    pytest.importorskip("torch")
    from gpipe_exec.cli import build_parser

    return build_parser()


COMMANDS = sorted({(page.relative_to(ROOT).as_posix(), command) for page in user_docs()
                   for command in fenced_commands(page.read_text(encoding="utf-8"))})


def test_fenced_commands_are_found():
    assert sum(program_argv(c) is not None for _, c in COMMANDS) > 30  # a regex gone wrong finds none
    assert fenced_commands("```bash\n$ a x \\\n  y  # c\nb && c > f\nd | e\n```\n") == ["a x y", "b", "c", "d"]


@pytest.mark.parametrize("page, command", COMMANDS)
def test_quoted_commands_parse(page, command):
    """Every gpipe-sim/gpipe-exec command a page gives parses (its subcommand and flags exist),
    every `python -m MODULE` names a module, and every `streamlit run FILE` a file."""
    words = command.split()
    if (program := program_argv(command)) is not None:
        try:
            _parser(program[0]).parse_args(program[1])
        except SystemExit as exc:
            pytest.fail(f"{page}: `{command}` does not parse (exit {exc.code})")
    elif "-m" in words and words[0].endswith("python"):
        import importlib.util

        module = words[words.index("-m") + 1]
        if module.startswith("gpipe_exec"):
            pytest.importorskip("torch")
        assert module == "pytest" or importlib.util.find_spec(module) is not None, f"{page}: no module {module}"
    elif "streamlit" in words[0] and words[1:2] == ["run"]:
        assert (ROOT / words[2]).is_file(), f"{page}: no file {words[2]}"


def test_the_sweep_sizes_the_guide_quotes():
    """docs/guide/sweeps.md's "N scenarios" beside a sweep file is how many points that file expands to."""
    from gpipe_sim.sweeps import expand, load_sweep

    text = (ROOT / "docs" / "guide" / "sweeps.md").read_text(encoding="utf-8")
    quoted = re.findall(r"(scenarios/sweeps/\w+\.yaml)[^\n]*?(?:#|`\s*runs)\s+([\d,]+) scenarios", text)
    assert len(quoted) >= 2
    for path, count in quoted:
        spec, base = load_sweep(ROOT / path)
        assert len(expand(spec, base)) == int(count.replace(",", "")), path
