"""The analytic presets against the zoo's real modules: parameters and output bytes exactly, and
forward FLOPs against torch's own counter (`FlopCounterMode`), at small sizes on CPU and at large
ones on the meta device, where nothing is allocated."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from gpipe_exec.zoo import build_layer, make_batch  # noqa: E402
from gpipe_sim.spec.layers import build_layers  # noqa: E402
from gpipe_sim.spec.scenario import parse_scenario  # noqa: E402

SAMPLES = 2
MODELS = {
    "mlp small": ({"preset": "mlp", "layers": 3, "width": 256, "input_dim": 100, "num_classes": 10}, "cpu"),
    "mlp large": ({"preset": "mlp", "layers": 2, "width": 16384, "input_dim": 8192, "num_classes": 1000}, "meta"),
    "transformer small": ({"preset": "transformer", "layers": 2, "d_model": 128, "d_ff": 512, "heads": 4,
                           "seq_len": 64, "vocab": 512}, "cpu"),
    "transformer odd": ({"preset": "transformer", "layers": 1, "d_model": 192, "d_ff": 768, "heads": 6,
                         "seq_len": 48, "vocab": 777}, "cpu"),
    "transformer large": ({"preset": "transformer", "layers": 1, "d_model": 8192, "d_ff": 32768, "heads": 64,
                           "seq_len": 4096, "vocab": 50257}, "meta"),
    "convnet small": ({"preset": "convnet", "layers": 6, "channels": 16, "image_size": 32, "num_classes": 10}, "cpu"),
    "convnet large": ({"preset": "convnet", "layers": 8, "channels": 256, "image_size": 224,
                       "num_classes": 1000}, "meta"),
}


def _layers(model: dict, device: str):
    """(preset layer, real module, its forward FLOPs per sample, its output bytes per sample) in order."""
    spec = parse_scenario({"model": model, "hardware": {"preset": "cpu"},
                           "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": SAMPLES}}).model
    presets = build_layers(spec, 4)
    x, _ = make_batch(spec, SAMPLES)
    x = x.to(device)
    out = []
    for i, preset in enumerate(presets):
        with torch.device(device):
            module = build_layer(spec, i)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            y = module(x)
        out.append((preset, module, counter.get_total_flops() / SAMPLES, y.numel() * y.element_size() / SAMPLES))
        x = y
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_parameters_and_outputs_are_the_modules(name):
    model, device = MODELS[name]
    layers = _layers(model, device)
    for preset, module, _, out_bytes in layers[:-1]:  # the head's preset output is the loss (4 B)
        assert preset.params == sum(p.numel() for p in module.parameters()), preset.name
        assert preset.output_bytes_per_sample == out_bytes, preset.name
    head, module, _, _ = layers[-1]
    assert head.params == sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", list(MODELS))
def test_forward_flops_within_2_percent_of_torch(name):
    """Per layer and for the whole model. Torch's counter counts matmuls and convolutions only, so a
    layer's other work the preset counts (an embedding's gather, a head's pooling) is allowed up
    to 1% of the model's total beside the 2%."""
    model, device = MODELS[name]
    layers = _layers(model, device)
    total_counted = sum(c for _, _, c, _ in layers)
    for preset, _, counted, _ in layers:
        assert abs(preset.forward_flops_per_sample - counted) <= 0.02 * counted + 0.01 * total_counted, preset.name
    total_preset = sum(p.forward_flops_per_sample for p, *_ in layers)
    assert total_preset == pytest.approx(total_counted, rel=0.02)
