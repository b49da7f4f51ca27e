"""The scenario: model, hardware, pipeline and training as one validated value, its overrides and the command's file."""
