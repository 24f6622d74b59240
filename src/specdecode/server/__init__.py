"""`specdecode serve`: an OpenAI-compatible HTTP server with continuous batching and speculation."""
