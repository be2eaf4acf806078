"""Operations: /healthz, /readyz and /metrics, traces, JSON logs, the refused-request
middleware and the 503 answer while the database is down."""
