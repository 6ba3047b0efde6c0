"""Small Django-free helpers every app may use (the bottom layer, beside `replica`): one TTL
cache, one per-event-loop holder, and the one module that owns every Redis key layout."""
