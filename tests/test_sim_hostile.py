"""Hostile and absurd input (issue 16): one regression test per crash class. Every input gives a
result whose every figure is finite, or one line naming the field and exit status 2."""

from __future__ import annotations

import json
import math
import time

import pytest
import yaml

from gpipe_sim.cli import main
from gpipe_sim.errors import ScenarioError
from gpipe_sim.schema import limits
from gpipe_sim.scenario.scenario import parse_scenario


def _simulate(tmp_path, capsys, content, *args, suffix=".yaml"):
    """Run `gpipe-sim simulate` on `content` (data, or raw bytes); (status, stdout, stderr)."""
    path = tmp_path / f"scenario{suffix}"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif suffix == ".json":
        path.write_text(json.dumps(content))
    else:
        path.write_text(yaml.safe_dump(content))
    status = main(["simulate", str(path), *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _refused(tmp_path, capsys, content, field, *args, suffix=".yaml"):
    """`content` is refused with one line that starts with `field` (a scenario path)."""
    status, out, err = _simulate(tmp_path, capsys, content, *args, suffix=suffix)
    assert status == 2, err
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("gpipe-sim: error: "), err
    assert field in err, err
    for internal in ("literal[", "function-after", "[key]", "tuple[", "Traceback"):
        assert internal not in err
    return err.strip()


def _finite(tmp_path, capsys, content, *args):
    """`content` simulates; its --json result is strict JSON with every figure finite."""
    status, out, err = _simulate(tmp_path, capsys, content, "--json", "--no-timeline", *args)
    assert status == 0, err
    assert err == ""

    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    result = json.loads(out, parse_constant=refuse)
    stack = [result]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, float):
            assert math.isfinite(node)
    assert result["step_time_s"] > 0
    return result


# ---------------------------------------------------------------------------------------------
# empty per-pair links


def test_empty_links_with_one_stage_simulates(tmp_path, capsys):
    _finite(tmp_path, capsys, {"hardware": {"preset": "h200", "links": []}, "pipeline": {"stages": 1}})


def test_empty_links_with_two_stages_is_refused(tmp_path, capsys):
    _refused(tmp_path, capsys, {"hardware": {"preset": "h200", "links": []}, "pipeline": {"stages": 2}},
             "hardware.links: 0 links for 2 stages")


# ---------------------------------------------------------------------------------------------
# numbers beyond float


@pytest.mark.parametrize("section, field", [
    ("hardware", {"preset": "h200", "accelerator": {"memory_bytes": 10**400}}),
    ("model", {"preset": "mlp", "width": 10**400}),
    ("model", {"preset": "transformer", "vocab": 10**400}),
    ("pipeline", {"batch_size": 10**400}),
    ("model", {"preset": "table", "layers": [{"name": "a", "params": 10**400, "forward_s_per_sample": 1e-3,
                                              "backward_s_per_sample": 1e-3}]}),
    ("hardware", {"preset": "v100", "link": {"bandwidth": 10**400}}),
    ("hardware", {"preset": "v100", "link": {"latency_s": "1e400 s"}}),
    ("model", {"preset": "uniform", "activation_bytes_per_sample": 10**400}),
])
def test_numbers_beyond_float_are_refused(tmp_path, capsys, section, field):
    data = {section: field}
    if section != "pipeline":
        data["pipeline"] = {"stages": 1}
    names = {"memory_bytes": "hardware.accelerator.memory_bytes", "width": "model.width", "vocab": "model.vocab",
             "batch_size": "pipeline.batch_size", "layers": "model.layers.0.params",
             "link": "hardware.link.", "activation_bytes_per_sample": "model.activation_bytes_per_sample"}
    key = next(k for k in (*field, *field.get("accelerator", {})) if k in names)
    _refused(tmp_path, capsys, data, names[key])


def test_a_number_over_the_limit_names_the_limit(tmp_path, capsys):
    err = _refused(tmp_path, capsys, {"model": {"preset": "mlp", "width": 10**400}}, "model.width")
    assert "limit of 1,000,000,000" in err
    err = _refused(tmp_path, capsys, {"model": {"preset": "uniform", "output_bytes_per_sample": 1e308}},
                   "model.output_bytes_per_sample")
    assert "limit of 1e+30" in err


# ---------------------------------------------------------------------------------------------
# wrong type for a path; files that are not UTF-8, too big, too deep, or endless


@pytest.mark.parametrize("path", [12, ["a.yaml"], {"a": 1}, True])
def test_table_path_of_the_wrong_type_is_refused(tmp_path, capsys, path):
    _refused(tmp_path, capsys, {"model": {"preset": "table", "path": path}}, "model.path")


def test_file_that_is_not_utf8_is_refused(tmp_path, capsys):
    err = _refused(tmp_path, capsys, b"model:\n  preset: caf\xe9\n", "not UTF-8 text")
    assert "line 2" in err
    table = tmp_path / "table.yaml"
    table.write_bytes(b"- name: caf\xe9\n")
    _refused(tmp_path, capsys, {"model": {"preset": "table", "path": str(table)}}, "layer table")


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_integers_over_the_digit_limit_are_refused(tmp_path, capsys, suffix):
    raw = (b'{"pipeline": {"stages": ' + b"9" * 5000 + b"}}") if suffix == ".json" else \
        (b"pipeline:\n  stages: " + b"9" * 5000 + b"\n")
    err = _refused(tmp_path, capsys, raw, "more than 4300 digits", suffix=suffix)
    assert "scenario" in err


@pytest.mark.parametrize("raw, suffix", [
    (b"a: " + b"[" * 490 + b"]" * 490 + b"\n", ".yaml"),
    (b"[" * 992 + b"]" * 992, ".json"),
    (b"[" * 100_000 + b"]" * 100_000, ".yaml"),  # would overflow the C stack of libyaml's composer
    (b"[" * 100_000 + b"]" * 100_000, ".json"),
    (b"model:\n" + b"".join(b"  " * (i + 1) + b"a:\n" for i in range(60)), ".yaml"),
])
def test_deep_nesting_is_refused_naming_the_limit(tmp_path, capsys, raw, suffix):
    err = _refused(tmp_path, capsys, raw, f"nested more than {limits.MAX_DEPTH} levels deep", suffix=suffix)
    assert "(the limit)" in err


def test_deep_nesting_in_process_is_refused():
    data: dict = {"model": {"preset": "uniform"}}
    node = data["model"]
    for _ in range(5000):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(ScenarioError, match="nested more than"):
        parse_scenario(data)


def test_a_file_over_the_size_limit_is_refused_at_once(tmp_path, capsys):
    raw = b"# " + b"x" * (limits.MAX_FILE_BYTES + 10) + b"\nmodel: {preset: uniform}\n"
    t0 = time.perf_counter()
    err = _refused(tmp_path, capsys, raw, "larger than the limit of")
    assert time.perf_counter() - t0 < 5
    assert "MiB" in err


def test_dev_zero_as_scenario_and_as_layer_table(capsys, tmp_path):
    t0 = time.perf_counter()
    assert main(["simulate", "/dev/zero"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "larger than the limit" in err
    _refused(tmp_path, capsys, {"model": {"preset": "table", "path": "/dev/zero"}}, "layer table")
    assert time.perf_counter() - t0 < 10


def test_directory_and_nul_in_names(tmp_path, capsys):
    _refused(tmp_path, capsys, {"model": {"preset": "table", "path": str(tmp_path)}}, "cannot read layer table")
    _refused(tmp_path, capsys, {"model": {"preset": "table", "path": "a\0b"}}, "model.path")


def test_alias_bomb_in_a_scenario_or_a_table_is_refused_without_expanding(tmp_path, capsys):
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"{n}: &{n} [{', '.join(['*' + p] * 10)}]" for p, n in zip("abcdefgh", "bcdefghi")]
    bomb = "\n".join(lines) + "\n"
    t0 = time.perf_counter()
    _refused(tmp_path, capsys, (bomb + "model: {preset: uniform}\n").encode(), "YAML aliases are expanded")
    table = tmp_path / "bomb.yaml"
    table.write_text(bomb + "layers: *i\n")
    _refused(tmp_path, capsys, {"model": {"preset": "table", "path": str(table)}}, "YAML aliases")
    assert time.perf_counter() - t0 < 10


def test_a_value_its_yaml_tag_cannot_hold_is_refused(tmp_path, capsys):
    _refused(tmp_path, capsys, b'model: {preset: uniform, layers: !!float ""}\n', "malformed YAML")
    _refused(tmp_path, capsys, b"model: {preset: uniform, layers: !!python/name:os.system }\n", "malformed YAML")


def test_recursive_alias_is_refused(tmp_path, capsys):
    _refused(tmp_path, capsys, b"model: &m {preset: uniform, x: *m}\n", "recursive YAML alias")


# ---------------------------------------------------------------------------------------------
# huge device ids, empty peak FLOPs


@pytest.mark.parametrize("stages, device_map", [(1, [9223372036854775808]), (2, [0, 1000000000000]),
                                                (2, [0, -1])])
def test_huge_device_ids_are_refused(tmp_path, capsys, stages, device_map):
    err = _refused(tmp_path, capsys, {"model": {"preset": "uniform"}, "pipeline": {"stages": stages},
                                      "hardware": {"preset": "v100", "stage_to_device": device_map}},
                   "hardware.stage_to_device.")
    if device_map[-1] > 0:
        assert f"limit of {limits.MAX_DEVICE_ID:,}" in err


def test_device_ids_up_to_the_limit_simulate(tmp_path, capsys):
    _finite(tmp_path, capsys, {"model": {"preset": "uniform"}, "pipeline": {"stages": 2},
                               "hardware": {"preset": "v100", "stage_to_device": [limits.MAX_DEVICE_ID, 7]}})


def test_empty_peak_flops_is_refused(tmp_path, capsys):
    _refused(tmp_path, capsys, {"hardware": {"preset": "v100", "accelerator": {"peak_flops": {}}}},
             "hardware.accelerator.peak_flops: give the peak rate of at least one")


# ---------------------------------------------------------------------------------------------
# infinite and degenerate values: refused, never simulated


@pytest.mark.parametrize("data, field", [
    ({"model": {"preset": "uniform"}, "hardware": {"preset": "v100", "link": {"latency_s": math.inf}}},
     "hardware.link.latency_s"),
    ({"hardware": {"preset": "v100", "accelerator": {"kernel_overhead_s": math.inf}}},
     "hardware.accelerator.kernel_overhead_s"),
    ({"hardware": {"preset": "v100", "accelerator": {"efficiency": 5.0e-324}}}, "hardware.accelerator.efficiency"),
    ({"model": {"preset": "uniform", "output_bytes_per_sample": 1.0e308}}, "model.output_bytes_per_sample"),
    ({"hardware": {"preset": "v100", "accelerator": {"peak_flops": {"fp32": math.inf}}}},
     "hardware.accelerator.peak_flops.fp32"),
    ({"hardware": {"preset": "v100", "accelerator": {"peak_flops": {"fp32": math.nan}}}},
     "hardware.accelerator.peak_flops.fp32"),
    ({"hardware": {"preset": "v100", "link": {"bandwidth": 5e-324}}}, "hardware.link.bandwidth"),
    ({"hardware": {"preset": "v100", "host": {"send_s": 1e300}}}, "hardware.host.send_s"),
    ({"model": {"preset": "uniform", "forward_s_per_sample": math.nan}}, "model.forward_s_per_sample"),
    ({"model": {"preset": "uniform", "forward_s_per_sample": 5e-324}}, "model.forward_s_per_sample"),
])
def test_degenerate_values_are_refused(tmp_path, capsys, data, field):
    _refused(tmp_path, capsys, data, field, "--json")


def test_json_infinity_and_nan_tokens_are_refused(tmp_path, capsys):
    raw = b'{"hardware": {"preset": "v100", "link": {"latency_s": Infinity}}}'
    _refused(tmp_path, capsys, raw, "hardware.link.latency_s", suffix=".json")
    raw = b'{"model": {"preset": "uniform", "forward_s_per_sample": NaN}}'
    _refused(tmp_path, capsys, raw, "model.forward_s_per_sample", suffix=".json")


def test_zero_step_is_refused_naming_the_likely_field(tmp_path, capsys):
    err = _refused(tmp_path, capsys, {"model": {"preset": "uniform", "forward_s_per_sample": 0,
                                                "backward_s_per_sample": 0},
                                      "hardware": {"preset": "ideal"}}, "model.forward_s_per_sample")
    assert "takes no time" in err


def test_unlimited_memory_and_bandwidth_still_simulate(tmp_path, capsys):
    result = _finite(tmp_path, capsys, {"model": {"preset": "uniform"},
                                        "hardware": {"preset": "ideal", "link": {"bandwidth": "inf"}}})
    assert result["memory_capacity_bytes"] is None


def test_result_check_refuses_a_non_finite_figure():
    from gpipe_sim.api import simulate

    scenario = parse_scenario({"model": {"preset": "uniform"}, "hardware": {"preset": "v100"}})
    result = simulate(scenario)
    assert limits.result_problem(scenario, result) is None
    result.stages[0].peak_memory_bytes = math.inf
    problem = limits.result_problem(scenario, result)
    assert problem and "peak memory" in problem and "\n" not in problem
    result.step_time_s = 0.0
    assert "takes no time" in limits.result_problem(scenario, result)


# ---------------------------------------------------------------------------------------------
# messages in the user's words, on one line


def test_key_with_a_newline_gives_one_line(tmp_path, capsys):
    err = _refused(tmp_path, capsys, {"model": {"preset": "uniform", "a\nb": 1}}, "model.'a\\nb': unknown key")
    assert err.count("\n") == 0
    _refused(tmp_path, capsys, {"model": {"preset": "uniform", "k\u2028": 1}}, "unknown key")


def test_bad_partition_names_the_field_without_internals(tmp_path, capsys):
    err = _refused(tmp_path, capsys, {"pipeline": {"partition": "foo"}}, "pipeline.partition: unknown partition")
    assert "uniform, time, memory" in err
    _refused(tmp_path, capsys, {"pipeline": {"partition": [1, "x"]}}, "pipeline.partition: entry 1")
    _refused(tmp_path, capsys, {"pipeline": {"partition": {"a": 1}}}, "pipeline.partition: expected")


def test_bad_peak_flops_key_names_the_field_without_internals(tmp_path, capsys):
    err = _refused(tmp_path, capsys, {"hardware": {"preset": "v100", "accelerator": {"peak_flops": {"fp64": 1e12}}}},
                   "hardware.accelerator.peak_flops.fp64: unknown key")
    assert "fp32" in err


def test_bad_schedule_and_preset_types(tmp_path, capsys):
    _refused(tmp_path, capsys, {"pipeline": {"schedule": ["gpipe"]}}, "pipeline.schedule: unknown schedule")
    _refused(tmp_path, capsys, {"hardware": {"preset": 5}}, "hardware.preset")
    _refused(tmp_path, capsys, {"model": {"preset": ["uniform"]}}, "model")
    _refused(tmp_path, capsys, {"model": {"layers": 4}}, "model.preset: required field is missing")


# ---------------------------------------------------------------------------------------------
# sizes that would hang: refused before any work, naming the limit


@pytest.mark.parametrize("layers", [1_000_000, 10**308])
def test_convnet_with_absurd_layers_is_refused_at_once(tmp_path, capsys, layers):
    t0 = time.perf_counter()
    err = _refused(tmp_path, capsys, {"model": {"preset": "convnet", "layers": layers}}, "model.layers")
    assert f"limit of {limits.MAX_LAYERS:,} layers" in err
    assert time.perf_counter() - t0 < 2


def test_layer_count_of_a_preset_over_the_limit(tmp_path, capsys):
    err = _refused(tmp_path, capsys, {"model": {"preset": "transformer", "layers": limits.MAX_LAYERS}},
                   "model.layers: the model has")
    assert "over the limit" in err


def test_passes_over_the_limit_are_refused(tmp_path, capsys):
    err = _refused(tmp_path, capsys, {"model": {"preset": "uniform", "layers": 4096},
                                      "pipeline": {"stages": 4096, "micro_batches": 1024, "batch_size": 1024}},
                   "pipeline.stages")
    assert f"limit of {limits.MAX_PASSES:,}" in err
    _refused(tmp_path, capsys, {"pipeline": {"stages": 10**4}}, f"limit of {limits.MAX_STAGES:,} stages")


def test_bench_size_is_within_the_limits():
    parse_scenario({"model": {"preset": "uniform", "layers": 128}, "hardware": {"preset": "ideal"},
                    "pipeline": {"stages": 128, "micro_batches": 1024, "batch_size": 1024}})


# ---------------------------------------------------------------------------------------------
# the fast evaluator; the command-line boundary


def test_fast_engine_gives_the_simpy_answer_for_1f1b_with_many_micro_batches(tmp_path, capsys):
    data = {"model": {"preset": "uniform"}, "pipeline": {"stages": 2, "micro_batches": 64, "schedule": "1f1b"}}
    fast = _finite(tmp_path, capsys, data, "--engine", "fast")
    simpy = _finite(tmp_path, capsys, data, "--engine", "simpy")
    assert fast["step_time_s"] == pytest.approx(simpy["step_time_s"], rel=1e-12)
    assert fast["bubble_fraction"] == pytest.approx(simpy["bubble_fraction"], rel=1e-9, abs=1e-12)


def test_trace_that_cannot_be_written_is_one_line(tmp_path, capsys):
    status, _, err = _simulate(tmp_path, capsys, {"model": {"preset": "uniform"}},
                               "--trace", str(tmp_path / "missing" / "t.json"))
    assert status == 2 and err.count("\n") == 1 and "--trace: cannot write" in err


def test_an_unexpected_error_is_one_line_and_exit_1(monkeypatch, capsys):
    import argparse

    from gpipe_sim.cli import run_command

    def boom(args):
        raise TypeError("first line\nsecond line")

    monkeypatch.delenv("GPIPE_TRACEBACK", raising=False)
    assert run_command("gpipe-sim", argparse.Namespace(func=boom)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" in err and "TypeError: first line" in err

    def deep(args):
        raise RecursionError("maximum recursion depth exceeded")

    assert run_command("gpipe-sim", argparse.Namespace(func=deep)) == 2
    assert "nested too deeply" in capsys.readouterr().err
    monkeypatch.setenv("GPIPE_TRACEBACK", "1")
    with pytest.raises(TypeError):
        run_command("gpipe-sim", argparse.Namespace(func=boom))


def test_fit_partition_with_data_parallel_simulates(tmp_path, capsys):
    # found by the fuzz: np.bincount in plan/partition.py's per_device raised ValueError here
    _finite(tmp_path, capsys, {"model": {"preset": "uniform", "layers": 8},
                               "pipeline": {"stages": 2, "data_parallel": 2, "partition": "fit",
                                            "micro_batches": 2, "batch_size": 8}})
