"""Training frameworks' configurations: a scenario written as Megatron-LM arguments, a torchtitan job
TOML or a DeepSpeed JSON file, and Megatron-LM arguments, a torchtitan TOML or a Hugging Face
config.json read back."""

FRAMEWORKS = ("megatron", "torchtitan", "deepspeed")  # what --emit writes
READABLE = ("megatron", "torchtitan", "hf")  # what `gpipe-sim read` reads (hf: a model's config.json)
