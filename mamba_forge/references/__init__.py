"""float64 NumPy references for every kernel family, usable on CPU and by the qualification harness.

Calling convention (what `qualify.reference = "mamba_forge.references.<mod>:<fn>"` names):

    fn(args: dict[str, numpy.ndarray | int | float], dims: dict[str, int]) -> dict[str, numpy.ndarray]

`args` holds every kernel parameter by name: pointer parameters as float64 arrays (ints stay integer arrays),
flat as the kernel sees them, holding their contents *before* the launch (bf16/f16 inputs already rounded to
their dtype); scalars as Python numbers. The result maps each output (or in/out) parameter name to its
expected float64 contents after the launch, flat; outputs it leaves out are only checked for being written.
"""
