"""The live dashboard (API process): the page, its assets and the JSON / SSE API behind it."""
