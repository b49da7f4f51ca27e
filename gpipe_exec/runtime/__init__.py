"""The per-rank runtime: chunks of the model and the interpreter of a rank's program."""
