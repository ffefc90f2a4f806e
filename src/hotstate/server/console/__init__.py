"""The operator's console: the page (GET /ui, the static files beside this module), the JSON it reads,
and the pure parts behind it (events, rates)."""
