"""What the benchmarks share: child processes (``procs``), the load generator (``load``), the fake
upstream (``upstream``), a Redis (``redis_server``), the run's table (``report``) and py-spy
profiles (``spy``)."""
