"""What a running process tells its operators: structured logs (quiet as a library) and
Prometheus metrics with their HTTP endpoint. W3C trace context and spans travel with calls, in
:mod:`pairlink._rpc.tracing`."""
