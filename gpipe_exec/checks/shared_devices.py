"""Host-time scale for ranks that share a device, fitted on the calibration pipeline placed like the scenario."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from gpipe_exec.launch.spawn import LaunchOptions, launch
from gpipe_exec.profile import ProfileOptions
from gpipe_exec.calibration.runtime import RuntimeFit, calibration_scenario
from gpipe_exec.checks.rounds import compare_rounds, predict_with_profile


def calibrate_shared(fit: RuntimeFit, device_map: Sequence[int], *, message_bytes: int = 64 * 1024,
                     steps: int = 5, options: LaunchOptions = LaunchOptions()) -> RuntimeFit:
    """Stages sharing devices wake each other, hand devices over and run their host work on the
    same cores, which costs more per action than `calibrate_runtime` sees with a device per stage.
    Run the calibration pipeline on `device_map` itself and scale the host times by the factor
    (at least 1) that makes gpipe_sim, with this pipeline's profile, reproduce its measured step."""
    scenario = calibration_scenario(message_bytes, device_map)
    # One launch: the pipeline profiled as its stages run, then run (validate's own rounds).
    payload = {"cases": [scenario], "rounds": 1, "steps": steps, "warmup": 2, "alone": False,
               "profile": ProfileOptions(min_time_s=0.2), "calibration": fit}
    done = launch(payload, scenario.mesh.process_devices(), options, task=compare_rounds)[0][0]
    measured, table = done.measured.result.step_time_s, done.table

    def scaled(alpha: float) -> RuntimeFit:
        return dataclasses.replace(fit, action_s=fit.action_s * alpha, send_s=fit.send_s * alpha,
                                   recv_s=fit.recv_s * alpha, shared_scale=alpha)

    def predicted(alpha: float) -> float:
        return predict_with_profile(scenario, table, scaled(alpha)).result.step_time_s

    lo, hi = 1.0, 64.0
    if predicted(lo) >= measured:
        return scaled(lo)
    if predicted(hi) <= measured:
        return scaled(hi)
    for _ in range(30):  # the step grows with the host times: bisect to 0.1%
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted(mid) < measured else (lo, mid)
        if hi / lo < 1.001:
            break
    return scaled((lo + hi) / 2)
