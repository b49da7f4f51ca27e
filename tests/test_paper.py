"""The GPipe paper's tables: experiment files load, normalisation is exact, reproduction holds."""

from __future__ import annotations


import math
import re
from pathlib import Path

import pytest

from gpipe_sim.cli import main
from gpipe_sim.studies.paper import PAPER_DIR, PaperError, load_experiment, run_paper
from gpipe_sim.scenario.scenario import load_scenario

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
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "paper.md"


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


def _cell(rows, group, cell, quantity=None):
    return next(r for r in rows if r.group == group and r.cell == cell and quantity in (None, r.quantity))


def test_the_guide_quotes_what_the_tables_show(tables):
    """The figures docs/guide/paper.md states in its prose ("What matches", "What misses") are
    those of today's tables: each sentence is rebuilt from the rows and must be on the page."""
    text = re.sub(r"\s+", " ", GUIDE.read_text(encoding="utf-8"))
    one, two, three = tables["1"], tables["2"], tables["3"]
    params = [r for r in one if r.quantity == "parameters (M)"]
    sizes = [r for r in one if r.quantity.startswith("largest")]
    near = [r for r in sizes if r.predicted is not None and abs(r.predicted - r.published) <= r.step]
    within = [r for r in two if abs(r.ratio - 1) <= 0.15]
    assert all(abs(r.ratio - 1) <= 0.15 for r in three)
    act = {r.cell: r.ratio for r in one if r.quantity.startswith("peak activation")
           and r.group.startswith("Transformer") and r.cell.startswith("Pipeline")}
    amoeba = [_cell(one, "AmoebaNet-D (8 GB)", c, "peak activation memory (GB)").ratio for c in ("Naive-1", "Pipeline-1")]
    m4 = [_cell(two, "AmoebaNet-D (18, 256)", f"K={k} M=4").ratio for k in (2, 4, 8)]
    t48 = [_cell(two, "Transformer-48", f"K={k} M=4").ratio for k in (4, 8)]
    stated = [
        f"All {len(params)} parameter counts are within {math.ceil(max(abs(r.ratio - 1) for r in params) * 100)}%",
        f"{len(near)} of the {len(sizes)} searches land within one step",
        f"All of Table 3 is within 15%, and {len(within)} of Table 2's {len(two)} cells",
        f"within {math.ceil(max(abs(r - 1) for r in act.values()) * 100)}% of the published sums for the "
        f"Transformer's {['no', 'one', 'two', 'three', 'four', 'five'][len(act)]} Pipeline columns",
        f"AmoebaNet-D's Naive-1 and Pipeline-1 are at {amoeba[0]:.2f} and {amoeba[1]:.2f} of theirs",
        f"Table 3's Transformer at K=8 ({_cell(three, 'Transformer-24', 'K=8').ratio:.2f}:",
        f"AmoebaNet-D at K=8 ({_cell(three, 'AmoebaNet-D (18, 128)', 'K=8').ratio:.2f}:",
        f"M=4 ({min(m4):.2f}-{max(m4):.2f}x too fast) and K=8 M=1 "
        f"({_cell(two, 'AmoebaNet-D (18, 256)', 'K=8 M=1').ratio:.2f})",
        f"K=4 and 8 at M=4 ({t48[0]:.2f} and {t48[1]:.2f})",
    ]
    missing = [s for s in stated if s not in text]
    assert not missing, f"docs/guide/paper.md no longer states what the tables show: {missing}"
