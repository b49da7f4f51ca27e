"""'Does not fit' in one short line: ranges of devices and the fullest, never one entry per device."""

from __future__ import annotations

from gpipe_sim import parse_scenario, simulate
from gpipe_sim.results.fit import id_ranges, over_capacity_text
from gpipe_sim.summary import summary_text

GiB = 2.0**30


def _result(devices: int, memory: str):
    return simulate(parse_scenario({
        "model": {"preset": "uniform", "layers": 16},
        "hardware": {"preset": "a100-80gb", "accelerator": {"memory_bytes": memory}},
        "pipeline": {"stages": devices, "micro_batches": 4, "batch_size": 16, "partition": "uniform"},
    }))


def test_id_ranges():
    assert id_ranges([0, 1, 2, 3, 6, 8, 9]) == "0-3, 6, 8-9"
    assert id_ranges([5]) == "5"
    assert id_ranges([]) == ""


def test_every_device_over_is_summarised_with_the_fullest():
    result = _result(16, "1 MiB")
    over = result.devices_over_capacity()
    assert len(over) == 16
    text = over_capacity_text(result)
    fullest = max(over, key=lambda entry: entry[2])
    assert text.startswith("devices 0-15 (16 of 16) do not fit; the fullest, device ")
    assert f"device {fullest[0]} (rank {fullest[0]})" in text and text.endswith("but has 1.00 MiB")
    assert "device 1 " not in text.replace(f"device {fullest[0]} ", "")  # no entry per device
    summary = summary_text(parse_scenario({"model": {"preset": "uniform", "layers": 16},
                                           "pipeline": {"stages": 16, "micro_batches": 4, "batch_size": 16}}),
                           result)
    line = next(line for line in summary.splitlines() if "fits in memory" in line)
    assert "NO: devices 0-15 (16 of 16) do not fit" in line


class Fake:
    """A result's memory figures: `peaks` GiB per device, 1 GiB each."""

    memory_capacity_bytes = 1 * GiB

    def __init__(self, peaks):
        self.device_peak_memory_bytes = {d: p * GiB for d, p in enumerate(peaks)}

    def devices_over_capacity(self):
        return [(d, [d], p) for d, p in self.device_peak_memory_bytes.items() if p > GiB]


def test_one_device_over_and_none_over():
    assert over_capacity_text(_result(2, "80 GiB")) is None
    assert over_capacity_text(Fake([0.5, 3, 0.5])) == "device 1 (rank 1) needs 3.00 GiB but has 1.00 GiB"


def test_scattered_devices_are_counted():
    text = over_capacity_text(Fake([2 if d % 2 else 0.5 for d in range(20)]))
    assert text.startswith("10 of 20 devices do not fit; the fullest, device 1 (rank 1), needs 2.00 GiB")
    assert over_capacity_text(Fake([2, 2, 0, 2, 3])).startswith("devices 0-1, 3-4 (4 of 5) do not fit; "
                                                                 "the fullest, device 4")
