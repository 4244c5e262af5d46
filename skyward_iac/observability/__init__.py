"""What a pool reports and how it is shown: events, the bus, consoles, metrics and logging.

``events`` (typed, frozen events) and ``bus`` (``EventBus``) carry everything a pool reports;
``console`` renders it (``rich``/``log``/``minimal``/``silent``); ``engine_events`` turns the
Pulumi engine's events into progress; ``metrics`` configures what nodes measure and ``sampler``
measures it on the node; ``logging`` holds ``LogConfig`` and the rotating file log.
Importing this package loads neither ``rich`` nor Pulumi.
"""
