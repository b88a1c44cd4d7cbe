"""The one module that talks to the Kubernetes API (the `kubernetes` client).

It loads the configuration (in-cluster, else a kubeconfig file and context), lists
and watches Pods and Nodes with bounded timeouts, reads and writes the Lease used
for leader election, writes Events on pods, and sorts client errors into what the
watch loop should do:

- ``GONE``: the resourceVersion expired (410, or "too large"): list again;
- ``RETRY``: dropped connection, read timeout, 429, 5xx, 401/403: back off, then
  watch again from the same resourceVersion.

Objects are handed over as plain dicts (the JSON the server sent), so the rest of
ks-scheduler never sees client model classes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from history.exceptions import KubeConfigError

logger = logging.getLogger(__name__)

GONE = "gone"
RETRY = "retry"
# Seconds an Event write may wait for the API server's answer.
EVENT_READ_TIMEOUT = 5.0


@dataclass(frozen=True)
class Failure:
    """What went wrong with a call, and what to do about it."""

    action: str  # GONE or RETRY
    reason: str  # short label for logs and metrics: gone, dropped, timeout, 500 ...
    detail: str


def api_client(
    *, kubeconfig: str | None = None, context: str | None = None
) -> client.ApiClient:
    """An ApiClient for the cluster: in-cluster config, else the kubeconfig file.

    `kubeconfig`/`context` force the file (and context) even inside a cluster.
    """
    configuration = client.Configuration()
    if kubeconfig is None and context is None:
        try:
            config.load_incluster_config(client_configuration=configuration)
            logger.info("Using the in-cluster service account configuration")
            return _finish(configuration)
        except ConfigException:
            pass
    try:
        config.load_kube_config(
            config_file=kubeconfig,
            context=context,
            client_configuration=configuration,
        )
    except (ConfigException, OSError, TypeError) as exc:
        raise KubeConfigError(
            f"no cluster configuration: not in a cluster and the kubeconfig "
            f"({kubeconfig or 'KUBECONFIG or ~/.kube/config'}) cannot be used: {exc}"
        ) from exc
    logger.info("Using kubeconfig for %s", configuration.host)
    return _finish(configuration)


def _finish(configuration: client.Configuration) -> client.ApiClient:
    # TCP keepalive finds dead peers even between reads (kubernetes >= 37).
    configuration.keep_alive = True
    # No quick retries inside urllib3 (three by default, each logging a WARNING):
    # the watch loop backs off and retries, and logs each failed attempt once.
    configuration.retries = 0
    return client.ApiClient(configuration)


class KubeApi:
    """List, watch and lease calls, each bounded by (connect, read) timeouts."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
    ) -> None:
        self.api = api
        # Called with _preload_content=False and plain dicts: typed as Any.
        self.core: Any = client.CoreV1Api(api)
        self.coordination: Any = client.CoordinationV1Api(api)
        self.events: Any = client.EventsV1Api(api)
        self.request_timeout = (connect_timeout, read_timeout)
        # An Event is one small write: it never waits as long as a list may.
        self.event_timeout = (connect_timeout, min(read_timeout, EVENT_READ_TIMEOUT))

    # ---- list and watch

    def _list_func(
        self, resource: str, namespace: str | None
    ) -> tuple[Callable[..., Any], dict[str, Any]]:
        if resource == "nodes":
            return self.core.list_node, {}
        if namespace:
            return self.core.list_namespaced_pod, {"namespace": namespace}
        return self.core.list_pod_for_all_namespaces, {}

    def list(
        self,
        resource: str,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        page_size: int = 500,
    ) -> tuple[list[dict[str, Any]], str]:
        """Every matching object (following `continue`) and the list's RV.

        A quorum read (no resourceVersion): the result is current, never stale.
        """
        func, kwargs = self._list_func(resource, namespace)
        items: list[dict[str, Any]] = []
        token = None
        resource_version = ""
        while True:
            extra: dict[str, str] = {"_continue": token} if token else {}
            response = func(
                **kwargs,
                **extra,
                label_selector=label_selector,
                field_selector=field_selector,
                limit=page_size,
                _preload_content=False,
                _request_timeout=self.request_timeout,
            )
            try:
                body = orjson.loads(response.data)
            finally:
                response.release_conn()
            metadata = body.get("metadata") or {}
            if not resource_version:
                resource_version = str(metadata.get("resourceVersion") or "")
            items.extend(body.get("items") or [])
            token = metadata.get("continue")
            if not token:
                return items, resource_version

    def watch(
        self,
        resource: str,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        server_timeout: int = 300,
    ) -> WatchStream:
        """A watch from `resource_version` with bookmarks; iterate the stream."""
        func, kwargs = self._list_func(resource, namespace)
        return WatchStream(
            func,
            dict(
                kwargs,
                resource_version=resource_version,
                label_selector=label_selector,
                field_selector=field_selector,
                allow_watch_bookmarks=True,
                timeout_seconds=server_timeout,
                _request_timeout=self.request_timeout,
            ),
        )

    # ---- leases (coordination.k8s.io/v1)

    def get_lease(self, *, name: str, namespace: str) -> dict[str, Any] | None:
        """The Lease as a dict, or None when it does not exist."""
        try:
            response = self.coordination.read_namespaced_lease(
                name,
                namespace,
                _preload_content=False,
                _request_timeout=self.request_timeout,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        try:
            lease: dict[str, Any] = orjson.loads(response.data)
            return lease
        finally:
            response.release_conn()

    def create_lease(self, *, namespace: str, body: dict[str, Any]) -> bool:
        """Create a Lease; False if someone else created it first (409)."""
        try:
            self.coordination.create_namespaced_lease(
                namespace, body, _request_timeout=self.request_timeout
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def replace_lease(self, *, name: str, namespace: str, body: dict[str, Any]) -> bool:
        """Replace a Lease at the resourceVersion in `body`; False on conflict."""
        try:
            self.coordination.replace_namespaced_lease(
                name, namespace, body, _request_timeout=self.request_timeout
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    # ---- events (events.k8s.io/v1)

    def create_event(self, *, namespace: str, body: dict[str, Any]) -> Failure | None:
        """Create an Event; None when it was written, else what went wrong."""
        try:
            # The answer is not read into model classes (most of a write's CPU).
            response = self.events.create_namespaced_event(
                namespace,
                body,
                _request_timeout=self.event_timeout,
                _preload_content=False,
            )
            # Read to the end, so the connection goes back to the pool for reuse
            # (an unread one is closed: a TLS handshake per Event).
            response.drain_conn()
            response.release_conn()
        except Exception as exc:
            failure = classify(exc)
            if failure is None:
                raise
            return failure
        return None


class _RawWatch(watch.Watch):
    """`watch.Watch` that reads each event's JSON once.

    For `return_type=object` the client parses each line, writes the object back to
    JSON and parses it again, only to hand over the same dict: most of the CPU a
    watch event costs. This keeps what the client does with the event (the raw
    object in `raw_object`, the resourceVersion it resumes from, None for a line
    that is not JSON) without the round trip.
    """

    def __init__(self, return_type: Any = None) -> None:
        super().__init__(return_type)  # type: ignore[no-untyped-call]

    def unmarshal_event(self, data: str, return_type: Any) -> Any:
        if not data or data.isspace():
            return None
        try:
            # orjson: the parse is most of what an event costs the reader thread.
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(event, dict):
            return None
        obj = event["raw_object"] = event.get("object")
        if event.get("type") != "ERROR" and isinstance(obj, dict):
            metadata = obj.get("metadata")
            if isinstance(metadata, dict) and "resourceVersion" in metadata:
                self.resource_version = metadata["resourceVersion"]
        return event


class WatchStream:
    """One watch request; iterating yields raw events (dicts, or None if unreadable).

    `stop()` may be called from another thread or a signal handler: it shuts the
    socket down, so a blocked read returns at once.
    """

    def __init__(self, func: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        self._func = func
        self._kwargs = kwargs
        # `object` keeps each event's object a plain dict: no model classes, and a
        # malformed object cannot break deserialization.
        self._watch: Any = _RawWatch(return_type=object)

    def __iter__(self) -> Iterator[dict[str, Any] | None]:
        for item in self._watch.stream(self._func, **self._kwargs):
            if item is None:
                yield None
                continue
            yield {"type": item.get("type"), "object": item.get("raw_object")}

    def stop(self) -> None:
        self._watch.stop()


def classify(exc: BaseException) -> Failure | None:
    """Sort an exception from a list or watch call; None when it is not the API's."""
    if isinstance(exc, ApiException):
        status = exc.status or 0
        text = f"{exc.reason or ''} {exc.body or ''}".strip()
        if status == 410:
            return Failure(GONE, "gone", text)
        if status == 504 and "too large resource version" in text.lower():
            return Failure(GONE, "too_large_rv", text)
        return Failure(RETRY, str(status), text)
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return Failure(RETRY, "read_timeout", str(exc))
    if isinstance(exc, urllib3.exceptions.MaxRetryError):
        # The request failed on its first try (no client retries); say why, not
        # the whole URL with its query.
        reason = exc.reason or exc
        if isinstance(reason, urllib3.exceptions.ReadTimeoutError):
            return Failure(RETRY, "read_timeout", str(reason))
        return Failure(RETRY, "unreachable", str(reason))
    if isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError):
        return Failure(RETRY, "dropped", str(exc))
    if isinstance(exc, OSError):
        return Failure(RETRY, "dropped", str(exc))
    return None


def error_event_failure(obj: Any) -> Failure:
    """The failure an ERROR event's Status object stands for."""
    status = obj if isinstance(obj, dict) else {}
    code = status.get("code") or 0
    text = f"{status.get('reason', '')}: {status.get('message', '')}"
    if code == 410:
        return Failure(GONE, "gone", text)
    if "too large resource version" in text.lower():
        return Failure(GONE, "too_large_rv", text)
    return Failure(RETRY, str(code or "error_event"), text)


def micro_time(moment: datetime) -> str:
    """A MicroTime as the API server writes it (Lease acquire/renew times)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str | None) -> datetime | None:
    """Parse an RFC 3339 (Micro)Time; None if missing or unreadable."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
