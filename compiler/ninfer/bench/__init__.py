"""`ninfer-bench`: load tests against a running or freshly started ninfer-server.

- `soak`: many mixed requests at a fixed concurrency, some clients disconnecting mid
  stream; checks every answer, that the server drains, that no KV block leaks and that
  its RSS stays flat.
- `serving`: decode fairness while another stream prefills a long prompt, and aggregate
  decode throughput as the number of streams grows.

Like `ninfer.runtime`, importing this package must not import TVM.
"""
