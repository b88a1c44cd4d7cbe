"""The pod watcher (`manage.py watch_pods`): turns placements into history.

- options.py: Options and Backoff;
- loop.py: Stream, the list/watch loop for one resource, with a handler composed in
  (handler.py says what a handler gives it); arrivals.py: how its events arrive
  (in batches, each read into a `Received`); writing.py: how they are written, with
  the checkpoint; transactions.py: one transaction per
  unit of work, and which database errors are fatal, transient or data errors;
- pods.py: `decide(pod)`, the pure rule for when a pod counts, and PodHandler;
  runs.py: what a pod's run took (startup, run time, outcome);
- nodes.py: node identity; lease.py: leader election; process.py: the process;
- state.py: checkpoints and health in WatchState; health.py: that health as the
  probes, the admin and /metrics read it; metrics.py, heartbeat.py;
- kube.py: the only module that imports `kubernetes`.

Kept free of imports, so `watcher_health` loads only what it uses.
"""
