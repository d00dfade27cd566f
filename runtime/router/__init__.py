"""`radixgen router`: one HTTP front for several servers, each request sent to a worker that
serves the model it names (a generation model and an embedding or rerank model behind one
endpoint), cache-aware among the workers of one model. Its own process; no torch.
"""
