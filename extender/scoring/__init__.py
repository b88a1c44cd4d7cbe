"""Scoring: pure rules (`rules`), scores kept per time window (`window`), the
strategies that feed them from the history reader (`strategies`), and the cluster
simulator that runs them over a synthetic workload (`simulation`)."""
