"""`ember-server`: an OpenAI-compatible HTTP server on ember's continuous-batching engine.
`create_app` (in ember.server.app) builds the FastAPI app; `python -m ember.server` runs it.
Nothing is imported here, so `ember.server.args` loads without the web stack."""
