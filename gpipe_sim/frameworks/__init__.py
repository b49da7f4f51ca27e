"""Training frameworks' configurations: a scenario written as Megatron-LM arguments, a torchtitan job
TOML or a DeepSpeed JSON file, and Megatron-LM arguments or a torchtitan TOML read back."""

FRAMEWORKS = ("megatron", "torchtitan", "deepspeed")  # what --emit writes
READABLE = ("megatron", "torchtitan")  # what `gpipe-sim read` reads
