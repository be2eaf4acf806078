"""The run engine: plain Python on plain data.

Nothing in this package imports Django, Celery or httpx; the whole state machine runs
in milliseconds with a scripted model (a test keeps it so).
"""
