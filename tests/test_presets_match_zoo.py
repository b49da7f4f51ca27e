"""The analytic presets against the zoo's real modules: parameters and output bytes exactly, forward
FLOPs against torch's own counter (`FlopCounterMode`), the bytes autograd saves for backward (counted
by the profiler's saved-tensor meter) and what a split backward keeps for its weight pass, at small
sizes on CPU and at large ones on the meta device, where nothing is allocated. On CPU and meta,
torch keeps a dropout's scaled noise (the activations' type), so the presets are built with
dtype-sized masks here (`hardware.accelerator.dropout_masks: dtype`, the cpu preset's)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from gpipe_exec.profile import measure_layer_bytes, saves_input_output, split_saved_bytes  # noqa: E402
from gpipe_exec.measure.meters import tensor_bytes  # noqa: E402
from gpipe_exec.zoo import build_layer, make_batch  # noqa: E402
from gpipe_sim.model.layers import build_layers  # noqa: E402
from gpipe_sim.scenario.scenario import parse_scenario  # noqa: E402

SAMPLES = 2
MODELS = {
    "mlp small": ({"preset": "mlp", "layers": 3, "width": 256, "input_dim": 100, "num_classes": 10}, "cpu"),
    "mlp large": ({"preset": "mlp", "layers": 2, "width": 16384, "input_dim": 8192, "num_classes": 1000}, "meta"),
    "transformer small": ({"preset": "transformer", "layers": 2, "d_model": 128, "d_ff": 512, "heads": 4,
                           "seq_len": 64, "vocab": 512, "attention": "flash"}, "cpu"),
    "transformer odd": ({"preset": "transformer", "layers": 1, "d_model": 192, "d_ff": 768, "heads": 6,
                         "seq_len": 48, "vocab": 777}, "cpu"),
    "transformer unpadded": ({"preset": "transformer", "layers": 1, "d_model": 64, "d_ff": 128, "heads": 2,
                              "seq_len": 16, "vocab": 777, "vocab_multiple": 1}, "cpu"),
    "transformer large": ({"preset": "transformer", "layers": 1, "d_model": 8192, "d_ff": 32768, "heads": 64,
                           "seq_len": 4096, "vocab": 50257}, "meta"),
    "transformer flash": ({"preset": "transformer", "layers": 1, "d_model": 256, "d_ff": 1024, "heads": 8,
                           "seq_len": 128, "vocab": 1000, "attention": "flash"}, "cpu"),
    "transformer flash no dropout": ({"preset": "transformer", "layers": 2, "d_model": 96, "d_ff": 200, "heads": 3,
                                      "seq_len": 40, "vocab": 300, "attention": "flash", "dropout": 0}, "cpu"),
    "transformer no dropout": ({"preset": "transformer", "layers": 1, "d_model": 64, "d_ff": 256, "heads": 2,
                                "seq_len": 256, "vocab": 100, "dropout": 0}, "cpu"),
    "llama small": ({"preset": "llama3-8b", "layers": 2, "d_model": 128, "d_ff": 352, "heads": 8, "kv_heads": 2,
                     "seq_len": 64, "vocab": 512, "attention": "standard"}, "cpu"),
    "llama flash": ({"preset": "llama3-8b", "layers": 1, "d_model": 128, "d_ff": 352, "heads": 8, "kv_heads": 2,
                     "seq_len": 64, "vocab": 512, "attention": "flash"}, "cpu"),
    "multi-query swiglu dropout": ({"preset": "transformer", "layers": 1, "d_model": 96, "d_ff": 200, "heads": 4,
                                    "kv_heads": 1, "mlp": "swiglu", "seq_len": 32, "vocab": 300}, "cpu"),
    "rmsnorm rope with biases": ({"preset": "transformer", "layers": 1, "d_model": 64, "d_ff": 256, "heads": 4,
                                  "norm": "rmsnorm", "position": "rope", "seq_len": 48, "vocab": 200}, "cpu"),
    "tied gpt": ({"preset": "gpt3-175b", "layers": 1, "d_model": 64, "d_ff": 256, "heads": 4, "seq_len": 32,
                  "vocab": 200}, "cpu"),
    "convnet small": ({"preset": "convnet", "layers": 6, "channels": 16, "image_size": 32, "num_classes": 10}, "cpu"),
    "convnet large": ({"preset": "convnet", "layers": 8, "channels": 256, "image_size": 224,
                       "num_classes": 1000}, "meta"),
    "convnet odd": ({"preset": "convnet", "layers": 5, "channels": 12, "image_size": 30, "num_classes": 7}, "cpu"),
}
# Flash attention on the meta device dispatches to the unfused kernel (which keeps the scores): its
# saved bytes are checked on CPU, where torch runs the fused one.


def _layers(model: dict, device: str):
    """(preset layer, real module, its forward FLOPs per sample, its output bytes per sample) in order."""
    spec = parse_scenario({"model": model, "hardware": {"preset": "cpu"},
                           "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": SAMPLES}}).model
    presets = build_layers(spec, 4, mask_bytes=4)
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
    if model.get("attention") == "flash":  # torch's counter has no formula for the CPU fused kernel:
        model = {**model, "attention": "standard"}  # the same matmuls, counted on the unfused one
    layers = _layers(model, device)
    total_counted = sum(c for _, _, c, _ in layers)
    for preset, _, counted, _ in layers:
        assert abs(preset.forward_flops_per_sample - counted) <= 0.02 * counted + 0.01 * total_counted, preset.name
    total_preset = sum(p.forward_flops_per_sample for p, *_ in layers)
    assert total_preset == pytest.approx(total_counted, rel=0.02)


def _saved(model: dict, device: str):
    """Per layer: (preset layer, what autograd saves for it per sample, what it saves in common with
    the previous layer, what a split backward's I keeps for W per sample; the last two on CPU only)."""
    spec = parse_scenario({"model": model, "hardware": {"preset": "cpu"},
                           "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": SAMPLES}}).model
    presets = build_layers(spec, 4, mask_bytes=4)
    x, y = make_batch(spec, SAMPLES)
    x, y = x.to(device), y.to(device)
    out, previous_saves_output = [], False
    for i, preset in enumerate(presets):
        first, last = i == 0, i == len(presets) - 1
        with torch.device(device):
            module = build_layer(spec, i)
        row, h = measure_layer_bytes(module, x, y, first=first, last=last, batch=SAMPLES)
        shared = kept = None
        if device == "cpu":
            saves_input, saves_output = saves_input_output(module, x, y, first=first, last=last)
            shared = tensor_bytes(x) / SAMPLES if saves_input and previous_saves_output else 0.0
            previous_saves_output = saves_output
            kept = split_saved_bytes(module, x, first=first)["kept_gradients"] / SAMPLES if not first else 0.0
        out.append((preset, row["activation_bytes_per_sample"], shared, kept))
        x = h
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_saved_bytes_within_5_percent_of_the_modules(name):
    """What the presets say each layer saves for backward against what autograd saves for the real
    module (the loss's 4-byte scalar aside, exact); on CPU also the tensor it shares with the
    previous layer and what the input pass keeps for the weight pass."""
    model, device = MODELS[name]
    for preset, saved, shared, kept in _saved(model, device):
        assert preset.activation_bytes_per_sample == pytest.approx(saved, rel=0.05), preset.name
        assert abs(preset.activation_bytes_per_sample - saved) <= 4, preset.name
        if shared is not None:
            assert preset.saved_with_previous_bytes_per_sample == shared, preset.name
            assert preset.kept_for_weight_bytes_per_sample == kept, preset.name


@pytest.mark.parametrize("multiple, rows", [(128, 896), (1, 777), (7, 777), (100, 800)])
def test_zoo_pads_the_vocabulary_as_the_preset(multiple, rows):
    """The embedding table and the head have `padded_vocab` rows (777 -> 896 by default, as
    Megatron-LM pads to a multiple of 128); the batch's ids and targets stay below `vocab`."""
    sizes = {"preset": "transformer", "layers": 1, "d_model": 32, "d_ff": 64, "heads": 2, "seq_len": 8,
             "vocab": 777, "vocab_multiple": multiple}
    spec = parse_scenario({"model": sizes, "pipeline": {"stages": 1}}).model
    assert spec.padded_vocab == rows
    assert build_layer(spec, 0).tokens.weight.shape == (rows, 32)
    assert build_layer(spec, 2).out.weight.shape == (rows, 32)
    ids, targets = make_batch(spec, 64)
    assert int(ids.max()) < 777 and int(targets.max()) < 777


def test_flash_attention_keeps_no_scores():
    """Flash saves the log-sum-exp (fp32, heads x seq) where standard attention keeps the softmax
    output, its dropout mask and the dropped-out probabilities (heads x seq x seq each); both count
    the same FLOPs (the scores' full 4 s^2 d, as model-FLOPs utilisation counts them)."""
    sizes = {"preset": "transformer", "layers": 1, "d_model": 64, "d_ff": 128, "heads": 4, "seq_len": 32, "vocab": 50}
    (_, standard, _), (_, flash, _) = (
        build_layers(parse_scenario({"model": {**sizes, "attention": a}, "pipeline": {"stages": 1}}).model, 2, 1)
        for a in ("standard", "flash"))
    a, s = 4, 32
    assert standard.activation_bytes_per_sample - flash.activation_bytes_per_sample == s * (a * s * (2 + 2 + 1) - 4 * a)
    assert standard.forward_flops_per_sample == flash.forward_flops_per_sample


def test_flash_block_computes_what_the_standard_block_computes():
    """Without dropout the zoo's flash block (torch's fused kernel) and its standard block give the
    same output and gradients (same weights)."""
    sizes = {"preset": "transformer", "layers": 1, "d_model": 48, "d_ff": 96, "heads": 3, "seq_len": 20,
             "vocab": 40, "dropout": 0}
    x = torch.randn(2, 20, 48)
    results = []
    for attention in ("standard", "flash"):
        spec = parse_scenario({"model": {**sizes, "attention": attention}, "pipeline": {"stages": 1}}).model
        block = build_layer(spec, 1)
        xi = x.clone().requires_grad_(True)
        out = block(xi)
        out.square().sum().backward()
        results.append((out.detach(), xi.grad, block.qkv.weight.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_largest_tensor_is_the_modules(name):
    """An optimizer's temporaries are the size of the tensor it steps: the presets name each
    layer's largest parameter tensor as the module has it."""
    model, device = MODELS[name]
    for preset, module, _, _ in _layers(model, device):
        assert preset.largest_tensor_params == max(p.numel() for p in module.parameters()), preset.name


@pytest.mark.parametrize("name", [n for n, (_, device) in MODELS.items() if device == "cpu"])
def test_head_frees_its_log_softmax_when_the_input_pass_ends(name):
    """What the head's forward saved that goes with the graph after its input pass (the loss's
    log-softmax: the weight pass needs only the kept logits' gradient and the projection's input),
    as the preset says, against the tracker (the target's 8 B per token aside)."""
    from gpipe_exec.profile import input_pass_memory

    model, device = MODELS[name]
    spec = parse_scenario({"model": model, "hardware": {"preset": "cpu"},
                           "pipeline": {"stages": 1, "micro_batches": 1, "batch_size": SAMPLES}}).model
    head = build_layers(spec, 4, mask_bytes=4)[-1]
    x, y = make_batch(spec, SAMPLES)
    n = len(build_layers(spec, 4, mask_bytes=4))
    with torch.no_grad():
        for i in range(n - 1):
            x = build_layer(spec, i)(x)
    measured = input_pass_memory(build_layer(spec, n - 1), x, y, last=True, batch=SAMPLES).freed / SAMPLES
    tokens = model.get("seq_len", 1)
    assert head.freed_after_input_pass_bytes_per_sample > 0
    assert measured == pytest.approx(head.freed_after_input_pass_bytes_per_sample, abs=8 * tokens)
