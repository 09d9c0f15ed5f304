"""What the gateway shows of itself: Prometheus metrics, the status document and page.

``view`` and ``page`` are pure (values in, text out); ``collect`` reads what the
broker, bridges, drivers and taps already count and feeds them. Nothing here is
imported unless ``[http]`` or Home Assistant discovery is configured.
"""
