"""Per-layer profiler (facade): measures each layer on this device and writes gpipe_sim's LayerSpec table."""

from __future__ import annotations

from gpipe_exec.profiling.layer_memory import (InputPassMemory, input_pass_memory, measure_layer,
                                               measure_layer_bytes, saves_input_output, split_saved_bytes,
                                               transient_bytes, transient_fit, transient_parts)
from gpipe_exec.profiling.options import ProfileOptions
from gpipe_exec.profiling.table import (average_tables, default_sizes, profile_device, profile_model,
                                        profile_on_devices, profile_on_rank, profile_together, table_scenario,
                                        too_large_to_build, write_table)
from gpipe_exec.profiling.timing import (CLOCKS, OUTLIER_FACTOR, Stamps, chain_times, split_times, time_layers,
                                         typical, typical_repeats)

__all__ = [
    "CLOCKS", "OUTLIER_FACTOR", "InputPassMemory", "ProfileOptions", "Stamps", "average_tables", "chain_times",
    "default_sizes", "input_pass_memory", "measure_layer", "measure_layer_bytes", "profile_device", "profile_model",
    "profile_on_devices", "profile_on_rank", "profile_together", "saves_input_output", "split_saved_bytes", "split_times",
    "table_scenario", "time_layers", "too_large_to_build", "transient_bytes", "transient_fit", "transient_parts",
    "typical", "typical_repeats", "write_table",
]
