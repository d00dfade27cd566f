"""The decoder layers the model architectures are composed of (scheduler process).

One responsibility a module: linear layers (`linear.py`), norms (`norm.py`), rotary tables
(`rotary.py`), attention over the paged KV pool (`attention.py`), gated MLPs (`mlp.py`),
mixture-of-experts blocks (`moe.py`), the pre-norm decoder block (`decoder.py`), and the
vocabulary's embedding and logits (`vocab.py`). The package sits below `runtime/models` (which
composes these into architectures) and above `radixgen.kernels` (whose kernels they call); it
imports no model module.
"""
