"""The GPipe paper's tables: experiment files load, normalisation is exact, reproduction holds."""

from __future__ import annotations


import pytest

from gpipe_sim.cli import main
from gpipe_sim.studies.paper import PAPER_DIR, PaperError, load_experiment, run_paper
from gpipe_sim.spec.scenario import load_scenario

# Cells docs/guide/paper.md reports as misses, with the effect the model lacks.
KNOWN_THROUGHPUT_MISSES = {
    ("AmoebaNet-D (18, 256)", "K=8 M=1"),
    ("AmoebaNet-D (18, 256)", "K=2 M=4"),
    ("AmoebaNet-D (18, 256)", "K=4 M=4"),
    ("AmoebaNet-D (18, 256)", "K=8 M=4"),
    ("Transformer-48", "K=4 M=4"),
    ("Transformer-48", "K=8 M=4"),
}
KNOWN_SIZE_MISSES = {("Transformer (16 GB)", "Naive-1")}


@pytest.fixture(scope="module")
def tables():
    return {exp.table: rows for exp, rows in run_paper(PAPER_DIR)}


def test_every_experiment_and_its_scenarios_load():
    files = sorted(PAPER_DIR.glob("table*.yaml"))
    assert [f.name for f in files] == ["table1.yaml", "table2.yaml", "table3.yaml"]
    for path in files:
        for group in load_experiment(path).groups:
            base = load_scenario(PAPER_DIR / group.base)  # a ready scenario file
            for cell in group.cells:
                base.with_updates(cell.set)


def test_throughput_is_normalised_to_the_reference_cell(tables):
    for table in ("2", "3"):
        rows = tables[table]
        for group in {r.group for r in rows}:
            first = next(r for r in rows if r.group == group)
            assert first.published == 1 and first.predicted == pytest.approx(1.0, abs=1e-12)
        for r in rows:
            assert r.ratio == pytest.approx(r.predicted / r.published)


def test_tables_2_and_3_within_15_percent_except_the_reported_misses(tables):
    for r in tables["2"] + tables["3"]:
        if (r.group, r.cell) in KNOWN_THROUGHPUT_MISSES:
            continue
        assert abs(r.ratio - 1) <= 0.15, (r.group, r.cell, r.ratio)


def test_table_1_parameters_within_5_percent_and_sizes_within_one_step(tables):
    rows = tables["1"]
    params = [r for r in rows if r.quantity == "parameters (M)"]
    assert len(params) == 10
    for r in params:
        assert abs(r.ratio - 1) <= 0.05, (r.group, r.cell, r.ratio)
    sizes = [r for r in rows if r.quantity.startswith("largest")]
    assert len(sizes) == 10
    for r in sizes:
        if (r.group, r.cell) in KNOWN_SIZE_MISSES:
            assert r.predicted is None or abs(r.predicted - r.published) > r.step
            continue
        assert abs(r.predicted - r.published) <= r.step, (r.group, r.cell, r.predicted)


def test_bad_experiment_file_is_one_line(tmp_path):
    (tmp_path / "table9.yaml").write_text("table: '9'\ntitle: x\nkind: speed\ngroups: []\n")
    with pytest.raises(PaperError, match="table9.yaml: kind"):
        run_paper(tmp_path)
    assert main(["paper", "--dir", str(tmp_path)]) == 2


def test_cli_paper_prints_published_beside_predicted(capsys):
    assert main(["paper", "--table", "3", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| network | cell | quantity | published | predicted | ratio | note |" in out
    assert out.count("| AmoebaNet-D (18, 128) |") == 3 and out.count("| Transformer-24 |") == 3
