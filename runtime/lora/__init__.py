"""Multi-LoRA serving (scheduler process): PEFT adapters read and checked against the base model
(`adapter.py`), each linear layer's adapter slots and their grouped application (`slots.py`),
and the registry with its LRU pool of slots and each step's row groups (`manager.py`). The
package sits above `runtime/layers` (a layer sees an adapter only as its `Linear.delta`) and
below the model executor.
"""
