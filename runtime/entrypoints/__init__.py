"""Entry points: the HTTP server (FastAPI app, SGLang's native API, the OpenAI API) and the offline Engine."""
