"""history.watcher.kube: which client errors are retried, relisted or fatal."""

import urllib3

from history.watcher import kube


def test_classify_sorts_client_errors():
    from kubernetes.client.exceptions import ApiException

    assert kube.classify(ApiException(status=410)).action == kube.GONE
    too_large = ApiException(status=504, reason="Too large resource version: 9")
    assert kube.classify(too_large).action == kube.GONE
    assert kube.classify(ApiException(status=429)).reason == "429"
    assert kube.classify(ValueError("x")) is None
    pool = urllib3.HTTPConnectionPool("api.example", 6443)
    url = "/api/v1/pods?labelSelector=ks-pipeline&limit=500"
    refused = urllib3.exceptions.NewConnectionError(pool, "Connection refused")
    failure = kube.classify(urllib3.exceptions.MaxRetryError(pool, url, refused))
    assert (failure.reason, failure.detail) == ("unreachable", str(refused))
    slow = urllib3.exceptions.ReadTimeoutError(pool, url, "Read timed out.")
    failure = kube.classify(urllib3.exceptions.MaxRetryError(pool, url, slow))
    assert failure.reason == "read_timeout"
