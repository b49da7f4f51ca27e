"""The architecture the tree promises: a lean simulator core, no import cycles."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ("gpipe_sim", "gpipe_sim.api", "gpipe_sim.scenario.scenario", "gpipe_sim.schedule", "gpipe_sim.plan.compile",
        "gpipe_sim.engines.simpy_engine", "gpipe_sim.engines.fast", "gpipe_sim.engines.reference",
        "gpipe_sim.results.result", "gpipe_sim.plan.memory_timeline", "gpipe_sim.results.trace")


def test_the_simulator_core_imports_only_numpy_simpy_pydantic_and_yaml():
    code = (f"import sys; import {', '.join(CORE)}; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'rich', 'pandas', 'pyarrow', 'plotly', 'streamlit', 'hypothesis'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def _imports(package: str) -> dict[str, set[str]]:
    """Module -> the project modules it imports (at any depth of its code, lazy imports included)."""
    graph: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(("gpipe_sim", "gpipe_exec")):
                deps.add(node.module)
                # `from package import module` depends on that module, not only on the package
                deps |= {f"{node.module}.{a.name}" for a in node.names
                         if (ROOT / Path(*node.module.split("."), f"{a.name}.py")).exists()}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith(("gpipe_sim", "gpipe_exec"))}
        graph[name] = deps
    return graph


def test_no_import_cycles():
    graph = {**_imports("gpipe_sim"), **_imports("gpipe_exec")}
    # a package's __init__ re-exporting its own modules is not a cycle between concepts
    edges = {m: {d for d in ds if d in graph and d != m and not m.startswith(d + ".") and not d.startswith(m + ".")}
             for m, ds in graph.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for d in edges[m]:
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(d):] + [d]))
            if d not in state:
                visit(d)
        path.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)


def test_the_core_does_not_import_the_studies():
    graph = _imports("gpipe_sim")
    for module, deps in graph.items():
        if module.startswith("gpipe_sim.studies") or module == "gpipe_sim.cli":
            continue
        assert not any(d.startswith("gpipe_sim.studies") for d in deps), module
