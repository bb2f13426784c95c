"""The HTTP API: `create_app(settings)`, its dependencies and routes."""
