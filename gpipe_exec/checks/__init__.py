"""Predictions checked against this machine: validate, selfcheck, accuracy studies, plan-check and the benchmark."""
