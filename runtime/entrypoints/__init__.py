"""HTTP entry points of the API process: the FastAPI app, SGLang's native API and the OpenAI API."""
