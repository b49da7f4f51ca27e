"""Units as the field writes them (issue 33): `b` is a bit and `B` a byte, spellings that could be
either are refused with one line, sizes in bits are refused, and every data quantity the README,
docs, presets and scenarios quote reads as its author meant."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpipe_sim.cli import main
from gpipe_sim.schema.units import parse_quantity

ROOT = Path(__file__).resolve().parent.parent
GB, GIB = 1e9, 2.0**30


@pytest.mark.parametrize("text, expected", [
    ("200 Gb/s", 200e9 / 8), ("200 Gbit/s", 200e9 / 8), ("200 Gbps", 200e9 / 8), ("200 Gbits/s", 200e9 / 8),
    ("400 Gb/s", 50e9), ("1.6 Tb/s", 1.6e12 / 8), ("100 Mb/s", 100e6 / 8), ("64 Kb/s", 8e3), ("64 kbit/s", 8e3),
    ("1 Gib/s", GIB / 8),
    ("200 GB/s", 200e9), ("200 GBps", 200e9), ("200 GByte/s", 200e9), ("900 GB/s", 900e9),
    ("1 GiB/s", GIB), ("3.35 TB/s", 3.35e12), ("4 MB/s", 4e6), ("4 kB/s", 4e3), ("4 KB/s", 4e3),
    ("1 B/s", 1.0), ("1e9", 1e9), ("inf", float("inf")),
])
def test_bandwidth_bit_is_b_and_byte_is_B(text, expected):
    assert parse_quantity(text, "bandwidth") == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("text, expected", [
    ("80 GB", 80e9), ("16 GiB", 16 * GIB), ("16 G", 16e9), ("256 KB", 256e3), ("12 bytes", 12.0), ("1 byte", 1.0),
    ("16 B", 16.0), ("1 TiB", 2.0**40), ("85017493504", 85017493504.0), ("unlimited", float("inf")),
])
def test_sizes_are_bytes(text, expected):
    assert parse_quantity(text, "bytes") == expected


@pytest.mark.parametrize("text, kind, expected", [
    ("125 TFLOPS", "flops", 125e12), ("989 tflop/s", "flops", 989e12), ("5 us", "seconds", 5e-6),
    ("2 MS", "seconds", 2e-3), ("1e12", "flops", 1e12),
])
def test_flop_rates_and_times_read_as_before(text, kind, expected):
    assert parse_quantity(text, kind) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("text, asks", [
    ("200 gb/s", "write 200 Gbit/s (bits) or 200 GB/s (bytes)"),
    ("200 gbps", "write 200 Gbit/s (bits) or 200 GB/s (bytes)"),
    ("200 GBPS", "write 200 Gbit/s (bits) or 200 GB/s (bytes)"),
    ("200 GB/S", "write 200 Gbit/s (bits) or 200 GB/s (bytes)"),
    ("64 kb/s", "write 64 kbit/s (bits) or 64 kB/s (bytes)"),
    ("1 b/s", "write 1 bit/s (bits) or 1 B/s (bytes)"),
    ("200 G", "has no bit or byte: write 200 Gbit/s (bits) or 200 GB/s (bytes)"),
])
def test_a_spelling_that_could_be_bits_or_bytes_asks_which(text, asks):
    with pytest.raises(ValueError, match="could be bits or bytes|has no bit or byte") as info:
        parse_quantity(text, "bandwidth")
    assert asks in str(info.value)
    # each suggested spelling reads back, as the bits or bytes it names
    bits, byte_form = re.findall(r"write (.+?) \(bits\) or (.+?) \(bytes\)", str(info.value))[0]
    assert parse_quantity(bits, "bandwidth") * 8 == pytest.approx(parse_quantity(byte_form, "bandwidth"))


@pytest.mark.parametrize("text, message", [
    ("80 Gb", "'80 Gb' is bits; a size is written in bytes: 80 GB (or 10 GB if 80 Gb was meant)"),
    ("80 Gbit", "'80 Gbit' is bits"),
    ("80 gb", "'80 gb' could be bits or bytes; a size is written in bytes: 80 GB"),
    ("80 GB/s", "'GB/s' is a rate"),
])
def test_sizes_in_bits_or_per_second_are_refused(text, message):
    with pytest.raises(ValueError) as info:
        parse_quantity(text, "bytes")
    assert message in str(info.value)


def test_a_size_is_not_a_bandwidth():
    with pytest.raises(ValueError, match="'GB' is a size; a bandwidth is written per second"):
        parse_quantity("200 GB", "bandwidth")


@pytest.mark.parametrize("field, value, message", [
    ("hardware.network", {"bandwidth": "200 gbps", "per": "node", "nics": 1},
     "hardware.network.bandwidth: '200 gbps' could be bits or bytes per second"),
    ("hardware.link", {"bandwidth": "50 GB/S"}, "hardware.link.bandwidth: '50 GB/S' could be bits or bytes"),
    ("hardware.accelerator", {"memory_bytes": "80 Gb"}, "hardware.accelerator.memory_bytes: '80 Gb' is bits"),
])
def test_the_command_names_the_field_in_one_line_and_exits_2(tmp_path, capsys, field, value, message):
    data = {"model": {"preset": "uniform", "layers": 8}, "hardware": {"preset": "a100-80gb", "devices_per_node": 2},
            "pipeline": {"stages": 4, "micro_batches": 4, "batch_size": 16}}
    data["hardware"][field.split(".")[1]] = value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_nic_written_in_gigabits_is_an_eighth_of_the_same_figure_in_gigabytes():
    from gpipe_sim.scenario.scenario import parse_scenario

    def network(bandwidth):
        return parse_scenario({"hardware": {"preset": "a100-80gb", "devices_per_node": 8, "network": {
            "bandwidth": bandwidth, "per": "node", "nics": 1}}}).hardware.network.bandwidth

    assert network("200 Gb/s") == network("25 GB/s") == network("200 GB/s") / 8 == 25e9


# Every data quantity (a size or a rate written with b or B) quoted in the user-facing text and
# files, with the value its author meant in bytes or bytes/s; None: refused by design (a spelling
# the docs show as one the parser asks about). A new quote fails `test_every_quoted_unit_...`
# until it is added here with its meaning.
QUOTED: dict[str, float | None] = {
    # network interfaces, as vendors sell them: gigabits per second
    "200 Gb/s": 25e9, "200 Gbit/s": 25e9, "200 Gbps": 25e9, "400 Gb/s": 50e9, "1.6 Tb/s": 200e9,
    "100 Mb/s": 12.5e6, "64 Kb/s": 8e3,
    "496 Gbit/s": 62e9, "656 Gbit/s": 82e9,  # TPU ICI per chip (Jouppi et al.)
    # NVLink, PCIe, HBM and measured rates: gigabytes per second
    **{f"{x} GB/s": float(x.replace(",", "")) * GB for x in (
        "1.58", "1.86", "2", "2.52", "2.63", "5", "12", "14.30", "15.75", "17.2", "20", "25", "36.22", "50",
        "62.5", "82", "100", "150", "200", "300", "400", "450", "600", "732", "900", "2039", "2,039", "3350",
        "4800")},
    "200 GBps": 200e9, "1 GiB/s": GIB, "1.8 TB/s": 1.8e12, "3.35 TB/s": 3.35e12, "4.8 TB/s": 4.8e12,
    "8 TB/s": 8e12, "130 TB/s": 130e12, "576 TB/s": 576e12,
    # sizes: bytes
    **{f"{x} GB": float(x.replace(",", "")) * GB for x in (
        "0.62", "6.26", "6.49", "8", "10", "16", "21.6", "24.62", "32", "64", "79.9", "80", "141", "186", "200", "372",
        "640", "1,128")},
    "80GB": 80 * GB, "141GB": 141 * GB, "640GB": 640 * GB,  # "A100-80GB", "H200 141GB", "DGX A100 640GB"
    "13.4 TB": 13.4e12,
    **{f"{x} GiB": float(x) * GIB for x in (
        "0.41", "1", "4", "8", "9.5", "11.7", "13", "16", "17.79", "22.13", "32", "40", "44.7", "52.4", "52.6", "67.9",
        "68.0", "70.0", "70.04", "74.37", "74.51", "74.92", "79.72", "80.70", "101.9", "127.85", "166.32")},
    "57 MiB": 57 * 2.0**20, "210 MiB": 210 * 2.0**20,  # the simulator's peak on the published runs (docs/guide/scale.md)
    "3.31 MiB": 3.31 * 2.0**20, "4.82 MiB": 4.82 * 2.0**20, "5.05 MiB": 5.05 * 2.0**20, "32 MiB": 32 * 2.0**20,
    "4 MB": 4e6, "8 MB": 8e6, "16 MB": 16e6, "160 MB": 160e6, "256 KB": 256e3, "370 MB": 370e6,
    "100 MB": 100e6, "200 MB": 200e6, "800 MB": 800e6,  # docs/guide/zero2-reduction.md: 25M fp32 parameters a layer
    "1 byte": 1.0, "6 bytes": 6.0, "8 bytes": 8.0, "12 bytes": 12.0, "85,017,493,504 bytes": 85017493504.0,
    "2 B": 2.0, "4 B": 4.0, "8 B": 8.0, "16 B": 16.0, "688,128 B": 688128.0, "787,456 B": 787456.0,
    # the executor's mixture-of-experts memory against the simulator (docs/guide/context-and-experts.md)
    **{f"{x} B": float(x.replace(",", "")) for x in (
        "2,000", "63,808", "76,736", "282,848", "284,856", "321,080", "321,632")},
    # the executor's context-parallel memory against the simulator (docs/guide/context-and-experts.md)
    **{f"{x} B": float(x.replace(",", "")) for x in ("15,744", "28,800", "71,296", "72,832", "87,008", "89,984")},
    # validate at C = 2 and E = 2 (docs/guide/validate-context-and-experts.md)
    **{f"{x} MiB": x * 2.0**20 for x in (11.56, 11.81, 11.82, 20.75, 28.35, 28.67)},
    "400 kB": 400e3,
    # a mixture of experts validated on CPU (docs/measurements/accuracy.md, 2026-11-27)
    **{f"{x} MiB": x * 2.0**20 for x in (7.16, 7.17, 3.42)},
    # spellings the hardware guide shows being refused
    "200 gb/s": None, "200 gbps": None, "200 GBPS": None, "80 Gb": None,
}
_NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_UNIT = r"(?:[kKmMgGtTpPeE]i?)?(?:bits?|Bytes?|bytes?|[bB])(?:/sec|/s|ps|PS)?"
_QUOTE = re.compile(rf"(?<![\w.,^])({_NUMBER})( ?)({_UNIT})(?!\w)")
QUOTING = ("README.md", "docs/**/*.md", "gpipe_sim/hardware/presets/*.yaml", "scenarios/**/*.yaml",
           "gpipe_sim/scenarios/**/*.yaml")


def quotes_in(text: str) -> list[str]:
    """The data quantities `text` quotes: a number then a unit with a bit or a byte ("200 Gb/s",
    "16 GiB", "12 bytes", "200 gb/s"). Not quotes: a bare B glued to its number ("1.3B
    parameters") and a lower-case size with no rate ("a100-80gb", "T = 2 mb 4": names and
    micro-batch counts)."""
    found = []
    for number, space, unit in _QUOTE.findall(text):
        if not space and unit in ("B", "b"):
            continue
        if unit.islower() and unit.endswith("b"):
            continue
        found.append(f"{number}{space}{unit}")
    return found


def test_quotes_in_finds_sizes_and_rates_not_counts():
    text = ("a 1.3B GPT, one 200 Gb/s NIC, 16 GiB and A100-80GB, 12 bytes/parameter, 2,039 GB/s, 16 B a token, "
            "2b6936b, a100-80gb, T = 2 mb 4, 200 gb/s, 80 Gb, 1 byte")
    assert quotes_in(text) == ["200 Gb/s", "16 GiB", "80GB", "12 bytes", "2,039 GB/s", "16 B", "200 gb/s", "80 Gb",
                               "1 byte"]


def test_every_quoted_unit_reads_as_its_author_meant():
    files = sorted({path for pattern in QUOTING for path in ROOT.glob(pattern)})
    assert any(path.name == "hardware.yaml" for path in files) and any(path.name == "README.md" for path in files)
    unknown = []
    for path in files:
        for quote in quotes_in(path.read_text()):
            if quote not in QUOTED:
                unknown.append(f"{path.relative_to(ROOT)}: {quote!r}")
                continue
            kind = "bandwidth" if re.search(r"(/s|ps|PS)$", quote) else "bytes"
            written = quote.replace(",", "")
            if QUOTED[quote] is None:
                with pytest.raises(ValueError):
                    parse_quantity(written, kind)
            else:
                assert parse_quantity(written, kind) == pytest.approx(QUOTED[quote], rel=1e-12), (path, quote)
    assert not unknown, f"quotes with no intended value in QUOTED (add them): {unknown}"
