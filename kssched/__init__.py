"""ks-scheduler: a history-aware Kubernetes scheduler extender."""

__version__ = "1.0.0"
