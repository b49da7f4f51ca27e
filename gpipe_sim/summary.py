"""Readable reports: the simulation summary table and the preset listing."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from gpipe_sim.hardware.hardware import Hardware
from gpipe_sim.model.layers import build_layers, describe_layer_count, total_params
from gpipe_sim.hardware.presets import hardware_presets
from gpipe_sim.results.fit import over_capacity_text
from gpipe_sim.results.result import Result
from gpipe_sim.results.run_cost import run_cost_rows
from gpipe_sim.model.model import AmoebaNetModel, ConvNetModel, MlpModel, TableModel, TransformerModel, UniformModel
from gpipe_sim.model.architectures import ARCHITECTURES
from gpipe_sim.model.model_flops import tied_parameters
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.schedule import Schedule
from gpipe_sim.schema.units import format_bytes, format_seconds


def render(*renderables: object) -> str:
    """Rich renderables as plain text, 110 columns wide, no colour: what the commands print."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=110, force_terminal=False, color_system=None)
    for item in renderables:
        console.print(item)
    return buffer.getvalue().rstrip()


SHOWN_RANKS = 8  # a summary lists the first and last ranks of a deeper pipeline, the rest in one row


def summary_text(scenario: Scenario, result: Result) -> str:
    """A summary of one simulated (or measured) step: headline figures and a per-stage table."""
    p, mesh = scenario.pipeline, scenario.mesh
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    model = scenario.model
    head.add_row("model", f"{model.preset}, {describe_layer_count(model)}")
    head.add_row("hardware", f"{scenario.hardware.preset or 'custom'}: {scenario.hardware.accelerator.name}")
    head.add_row("pipeline", f"K={p.stages} v={p.chunks} M={p.micro_batches} batch={p.batch_size} "
                             f"schedule={p.schedule_name} remat={p.remat} partition={p.partition}"
                             + (f" D={p.data_parallel}" if p.data_parallel > 1 else "")
                             + (f" T={p.tensor_parallel}" if p.tensor_parallel > 1 else "")
                             + (f" C={p.context_parallel}" if p.context_parallel > 1 else "")
                             + (f" E={p.expert_parallel}" if p.expert_parallel > 1 else ""))
    if p.tensor_parallel > 1:
        head.add_row("tensor parallel", tensor_parallel_text(scenario, result))
    if p.context_parallel > 1:
        share = (f"{model.seq_len // p.context_parallel:,} tokens a device" if hasattr(model, "seq_len")
                 else "a layer table of one device's share")  # profiled at C: the ring inside its times
        head.add_row("context parallel", f"C={p.context_parallel}: {share}, keys and values passed around a ring "
                                         f"beside the attention; gradients reduced over D x C = {mesh.gradient_group} "
                                         "devices")
    head.add_row("step time", format_seconds(result.step_time_s))
    head.add_row("throughput", f"{result.throughput_samples_per_s:,.2f} samples/s")
    for name, text in quoted_figures_rows(result) + run_cost_rows(result.run):
        head.add_row(name, text)
    head.add_row("bubble", f"{result.bubble_fraction:.4f} (the schedule's analytic bubble on ideal "
                           f"hardware: {result.analytic_bubble_fraction:.4f})")
    head.add_row("  imbalance", f"{result.imbalance_fraction:.4f} (uneven ranks: 1 - mean busy / busiest; "
                                "a `time` or `fit` partition lowers it)")
    head.add_row("  fill/drain", f"{result.busiest_idle_fraction:.4f} (busiest rank idle; "
                                 "1 - bubble = (1 - imbalance) x (1 - fill/drain))")
    cap = result.memory_capacity_bytes
    fit = "yes" if result.fits_in_memory else f"NO: {over_capacity_text(result) or 'over capacity'}"
    head.add_row("fits in memory", f"{fit} (capacity {format_bytes(cap)} per device)")
    table = Table(title="per pipeline rank (stage)")
    for col in ("rank", "layers", "device", "busy", "params", "optimizer+grads", "peak activations", "peak memory"):
        table.add_column(col, justify="right")
    shown = result.stages
    if len(shown) > 2 * SHOWN_RANKS:  # the --json output has them all
        shown = shown[:SHOWN_RANKS] + [None] + shown[-SHOWN_RANKS:]  # type: ignore[list-item]
    for s in shown:
        if s is None:
            hidden = result.stages[SHOWN_RANKS:-SHOWN_RANKS]
            busy = [h.busy_s for h in hidden]
            peak = [h.peak_memory_bytes for h in hidden]
            table.add_row(f"{hidden[0].index}-{hidden[-1].index}", f"({len(hidden)} ranks)", "",
                          f"{format_seconds(min(busy))}-{format_seconds(max(busy))}", "", "", "",
                          f"{format_bytes(min(peak))}-{format_bytes(max(peak))}")
            continue
        over = s.peak_memory_bytes > result.memory_capacity_bytes
        table.add_row(
            str(s.index), s.layers_text, _devices(s.device, mesh.devices_per_rank), format_seconds(s.busy_s),
            format_bytes(s.param_bytes), format_bytes(s.state_bytes),
            format_bytes(s.peak_activation_bytes),
            format_bytes(s.peak_memory_bytes) + (" !" if over else ""),
        )
    return render(head, table)


def _devices(first: int, tp: int) -> str:
    """A rank's devices: its one, or the T x C consecutive ones from `first` (`tp`: T x C)."""
    return str(first) if tp <= 1 else f"{first}-{first + tp - 1}"


def tensor_parallel_text(scenario: Scenario, result: Result) -> str:
    """T, whether sequence parallel, and the seconds the collectives add to the busiest rank's
    passes (a layer table profiled at T: inside its measured passes, not priced apart; a measured
    step: inside the passes the executor timed, not timed apart)."""
    p = scenario.pipeline
    shape = "T x C x K x D" if p.context_parallel > 1 else "T x K x D"
    if isinstance(scenario.model, TableModel) or result.source != "simulated":
        where = ("the layer table's measured passes (profiled at T={})".format(p.tensor_parallel)
                 if result.source == "simulated" else "the measured passes (not timed apart)")
        return (f"T={p.tensor_parallel}{' with sequence parallelism' if p.sequence_parallel else ''} "
                f"({result.num_devices} devices = {shape}); the collectives are inside {where}")
    busiest = max(result.stages, key=lambda s: s.busy_s)
    share = busiest.tp_comm_s / busiest.busy_s if busiest.busy_s > 0 else 0.0
    kind = "reduce-scatter + all-gather" if p.sequence_parallel else "all-reduce"
    return (f"T={p.tensor_parallel}{' with sequence parallelism' if p.sequence_parallel else ''} "
            f"({result.num_devices} devices = {shape}); {kind} in the passes adds "
            f"{format_seconds(busiest.tp_comm_s)} to rank {busiest.index}'s {format_seconds(busiest.busy_s)} "
            f"busy ({share:.0%}; per rank: --json stages[].tp_comm_s)")


def parameters_short(parameters: int) -> str:
    """A parameter count as people say it: "1.31B", "350M", "12.5K", "800"."""
    scales = ((1e3, "K"), (1e6, "M"), (1e9, "B"), (1e12, "T"))
    for i, (scale, suffix) in reversed(list(enumerate(scales))):
        if parameters >= scale:
            text = f"{parameters / scale:.3g}"
            if float(text) >= 1000 and i + 1 < len(scales):  # 999,999 -> "1M", not "1e+03K"
                scale, suffix = scales[i + 1]
                text = f"{parameters / scale:.3g}"
            if float(text) >= 1000:  # beyond the largest suffix
                text = f"{parameters / scale:,.0f}"
            return f"{text}{suffix}"
    return f"{parameters:,}"


def parameters_text(parameters: int) -> str:
    """A parameter count in short and in full: "1.31B (1,313,626,112)"."""
    short = parameters_short(parameters)
    return short if short == f"{parameters:,}" else f"{short} ({parameters:,})"


def quoted_figures_rows(result: Result) -> list[tuple[str, str]]:
    """The figures people quote to check a plan: parameters, tokens/s, model TFLOP/s per device and
    MFU, each with why it is missing where it is (rows of the summary)."""
    f = result.figures
    if f is None:
        return []
    rows = [("parameters", parameters_text(f.parameters))]
    tokens = result.tokens_per_s
    rows.append(("tokens/s", f"{tokens:,.0f}" if tokens is not None else "- (not a token model: see samples/s)"))
    tflops, mfu = result.tflops_per_device, result.mfu
    if tflops is None or mfu is None:
        why = "- (a layer gives no FLOPs: timed in seconds)"
        rows += [("TFLOP/s per device", why), ("MFU", why)]
    else:
        peak = (f.peak_flops_per_device or 0.0) / 1e12
        rows.append(("TFLOP/s per device", f"{tflops:,.1f} (model FLOPs: forward + backward, "
                                           "re-computation not counted)"))
        convention = "Megatron-LM's; " if result.mfu_palm is not None else ""
        rows.append(("MFU", f"{mfu:.1%} ({convention}of the accelerator's peak {peak:,.1f} TFLOP/s per device)"))
        if result.mfu_palm is not None:
            rows.append(("MFU (PaLM)", f"{result.mfu_palm:.1%} (6 N + 12 L H Q T FLOPs per token)"))
    return rows


def presets_text() -> str:
    """The model presets with their default sizes, and the hardware presets with key figures."""
    models = Table(title="model presets (defaults)")
    for col in ("preset", "fields", "layers", "params"):  # a transformer's layer count on one line
        models.add_column(col, no_wrap=col in ("preset", "params"), min_width=40 if col == "layers" else None,
                          max_width=38 if col == "fields" else None)
    for spec in (UniformModel(), TransformerModel(), AmoebaNetModel(), MlpModel(), ConvNetModel()):
        fields = ", ".join(f"{k}={v}" for k, v in spec.model_dump(exclude_none=True).items() if k != "preset")
        layers = build_layers(spec)
        models.add_row(spec.preset, fields, describe_layer_count(spec), f"{total_params(layers) / 1e6:,.1f}M")
    for name, sizes in ARCHITECTURES.items():  # published architectures: the transformer preset's fields
        spec = TransformerModel(**sizes)
        shown = ", ".join(f"{k}={sizes[k]}" for k in ("d_model", "heads", "kv_heads", "d_ff", "seq_len", "experts",
                                                      "top_k", "expert_d_ff", "shared_experts", "mlp", "position")
                          if k in sizes)
        models.add_row(name, f"transformer: {shown}", describe_layer_count(spec),
                       parameters_short(total_params(build_layers(spec)) - tied_parameters(spec)))
    models.add_row("table", "path: per-layer YAML/JSON (as written by gpipe-exec profile)", "one per row", "-")
    hw = Table(title="hardware presets")
    for col in ("preset", "accelerator", "peak fp32/bf16", "memory", "mem bw", "link bw", "latency", "nodes"):
        hw.add_column(col)
    for name in hardware_presets():
        h = Hardware.model_validate({"preset": name})
        a = h.accelerator
        peaks = "/".join(f"{a.peak_flops[d] / 1e12:g}" for d in ("fp32", "bf16")) + " TFLOP/s"
        hw.add_row(name, a.name, peaks, format_bytes(a.memory_bytes), _bw(a.memory_bandwidth),
                   _bw(h.link.bandwidth), format_seconds(h.link.latency_s), _nodes(h))
    return render(models, hw)


def _nodes(hardware: Hardware) -> str:
    """A cluster preset's nodes and network ("8/node, 8x400 Gb/s"); "-" for one accelerator."""
    net = hardware.network
    if hardware.devices_per_node is None or net is None:
        return "-"
    ports = f"{net.nics}x" if net.per == "node" else "a port each at "
    return f"{hardware.devices_per_node}/node, {ports}{net.bandwidth * 8 / 1e9:g} Gb/s"


def _bw(value: float) -> str:
    return "inf" if value == float("inf") else f"{value / 1e9:g} GB/s"


_PASS_LETTERS = {0: "F", 1: "B", 2: "I", 3: "W"}  # Kind codes of the passes, as torch's CSV writes them
SHOWN_PASSES = 6


def schedule_text(scenario: Scenario, schedule: Schedule) -> str:
    """A schedule's programs in short: per rank, its chunks, how many of each pass and transfer it
    runs, and its first passes in torch's notation (chunk, F/B/I/W, micro-batch)."""
    import numpy as np

    from gpipe_sim.schedule import Kind

    p = scenario.pipeline
    head = (f"schedule {p.schedule_name}: K={schedule.ranks} ranks x v={schedule.chunks} "
            f"chunk{'s' if schedule.chunks != 1 else ''} per rank, M={schedule.micro_batches} micro-batches, "
            f"remat={schedule.remat}")
    table = Table(title="passes per pipeline rank",
                  caption="F forward, B backward, I/W input/weight gradient, R recompute")
    kinds = (Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT, Kind.RECOMPUTE,
             Kind.SEND, Kind.RECV)
    for col in ("rank", "chunks", "F", "B", "I", "W", "R", "send", "recv", "first passes"):
        table.add_column(col, justify="left" if col == "first passes" else "right",
                         no_wrap=col in ("first passes", "rank"))
    c = schedule.columns
    counts = np.zeros((schedule.ranks, len(Kind)), dtype=np.int64)
    np.add.at(counts, (c.rank.astype(np.int64), c.kind.astype(np.int64)), 1)
    ranks: list[int | None] = list(range(schedule.ranks))
    if len(ranks) > 2 * SHOWN_RANKS:
        ranks = ranks[:SHOWN_RANKS] + [None] + ranks[-SHOWN_RANKS:]
    for r in ranks:
        if r is None:
            table.add_row("...", f"({schedule.ranks - 2 * SHOWN_RANKS} ranks)", *[""] * (len(kinds) + 1))
            continue
        lo, hi = int(c.offsets[r]), int(c.offsets[r + 1])
        first = []
        for kind, chunk, mb in zip(c.kind[lo:hi].tolist(), c.chunk[lo:hi].tolist(), c.micro_batch[lo:hi].tolist()):
            if kind in _PASS_LETTERS:
                first.append(f"{chunk}{_PASS_LETTERS[kind]}{mb}")
                if len(first) > SHOWN_PASSES:
                    break
        shown = " ".join(first[:SHOWN_PASSES]) + (" ..." if len(first) > SHOWN_PASSES else "")
        table.add_row(str(r), ",".join(map(str, schedule.chunks_of(r))),
                      *(f"{int(counts[r, int(k)]):,}" for k in kinds), shown)
    return render(head, table)
