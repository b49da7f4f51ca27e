"""The architecture the tree promises: a lean simulator core, no import cycles, each layer importing only those below it."""

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


# The layers of the tree, lowest first, as docs/guide/architecture.md draws them: a folder or
# top-level module imports only from its own layer or a lower one (lazy imports included). Every
# module belongs to one entry; a new folder is placed here and on that page.
LAYERS = (
    ("gpipe_sim.errors", "gpipe_sim.process", "gpipe_sim.schema", "gpipe_sim.schedule", "gpipe_sim.mesh",
     "gpipe_sim.reference", "gpipe_sim.kept"),
    ("gpipe_sim.hardware", "gpipe_sim.model"),
    ("gpipe_sim.costs",),
    ("gpipe_sim.scenario",),
    ("gpipe_sim.results",),
    ("gpipe_sim.plan",),
    ("gpipe_sim.engines",),
    ("gpipe_sim.api", "gpipe_sim.summary", "gpipe_sim.charts", "gpipe_sim.frameworks"),
    ("gpipe_sim.planner", "gpipe_sim.sweeps", "gpipe_sim.studies", "gpipe_sim.waits"),
    ("gpipe_sim.cli", "gpipe_sim"),
    ("gpipe_exec.errors", "gpipe_exec.expert_tensor", "gpipe_exec.moe", "gpipe_exec.ring_attention"),
    ("gpipe_exec.measure",),
    ("gpipe_exec.runtime", "gpipe_exec.zoo", "gpipe_exec.reference", "gpipe_exec.context_parallel"),
    ("gpipe_exec.launch", "gpipe_exec.execute"),
    ("gpipe_exec.profiling", "gpipe_exec.profile", "gpipe_exec.calibration"),
    ("gpipe_exec.checks",),
    ("gpipe_exec.cli", "gpipe_exec"),
    ("gpipe_app",),
    ("app",),
)
PACKAGES = ("gpipe_sim", "gpipe_exec", "gpipe_app", "app")


def _module_imports(package: str) -> dict[str, set[str]]:
    """Module -> the project modules and packages it imports (`from p import m` names p.m where m is
    a module or a package of p, else p), at any depth of its code."""
    graph: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                folder = ROOT / Path(*node.module.split("."))
                subs = {f"{node.module}.{a.name}" for a in node.names
                        if (folder / f"{a.name}.py").exists() or (folder / a.name / "__init__.py").exists()}
                deps |= subs or {node.module}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.split(".")[0] in PACKAGES}
        graph[name] = deps
    return graph


def _layer(module: str) -> tuple[int, str]:
    """(layer, entry) of a module: the longest entry of LAYERS that is it or holds it."""
    found = [(len(entry), i, entry) for i, layer in enumerate(LAYERS) for entry in layer
             if module == entry or module.startswith(entry + ".")]
    assert found, f"{module} is in no layer of LAYERS (docs/guide/architecture.md)"
    _, i, entry = max(found)
    return i, entry


def test_each_folder_imports_only_its_own_layer_or_below():
    wrong = []
    for package in PACKAGES:
        for module, deps in _module_imports(package).items():
            layer, entry = _layer(module)
            wrong += [f"{module} ({entry}) imports {d} ({_layer(d)[1]})" for d in sorted(deps) if _layer(d)[0] > layer]
    assert not wrong, "\n".join(wrong)


def test_the_simulator_and_the_app_never_import_the_executor_or_torch():
    for package in ("gpipe_sim", "gpipe_app", "app"):
        for module, deps in _module_imports(package).items():
            assert not any(d.split(".")[0] == "gpipe_exec" for d in deps), module
        for path in (ROOT / package).rglob("*.py"):
            imported = {name.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                        for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])}
            assert "torch" not in imported, path
