"""Which engine times a compiled plan: the names a user may pick and the one default every tool takes."""

from __future__ import annotations

from typing import Literal, get_args

# auto: the fast evaluator where no device or link is shared by two ranks (nothing contends), else
# the SimPy engine (`gpipe_sim.api.run_engine`); simpy: the SimPy engine, which models contention;
# fast: the fast evaluator, exact for contention-free plans only.
Engine = Literal["auto", "simpy", "fast"]
ENGINES: tuple[Engine, ...] = get_args(Engine)
DEFAULT_ENGINE: Engine = "auto"

__all__ = ["DEFAULT_ENGINE", "ENGINES", "Engine"]
