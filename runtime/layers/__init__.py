"""The decoder layers the model architectures are composed of (scheduler process).

The package sits below `runtime/models` (which composes these into architectures) and above
`radixgen.kernels` (whose kernels they call); it imports no model module.
"""
