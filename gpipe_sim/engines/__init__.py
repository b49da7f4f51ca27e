"""Engines that time a compiled program: the SimPy discrete-event engine and the exact fast evaluator."""
