"""The gateway's benchmarks: ``python -m bench <scenario>`` (``python -m bench --help`` lists them).

``bench.scenarios`` holds one module per benchmark, ``bench.lib`` what they share (processes, the
load generator, the fake upstream, the report, the profiler)."""
