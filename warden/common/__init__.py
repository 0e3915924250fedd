"""Small helpers every room of warden shares: child processes, waiting, ports, reading a
/metrics page, the tiny model that tests, demos and stacks run. None of them imports vLLM.
(Prometheus' HTTP API has one client too: ``dashboards.promapi``, which dashboards use without
importing warden.)"""
