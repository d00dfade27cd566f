"""KV memory pools and prefix caches (radix tree, chunk cache); scheduler process."""
