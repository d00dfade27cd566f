"""Data parallelism: the link from the API process to one or N scheduler replicas, and the policies that route between them."""
