"""Where a step's time and memory go: phase by phase, operation by
operation, the dense kernels alone, and the step compiled ahead of time for
TPU slices."""
