from django.apps import AppConfig
from django.core.signals import request_finished
from django.db.models.signals import post_migrate


class HistoryConfig(AppConfig):
    name = "history"
    verbose_name = "Pipeline history"

    def ready(self) -> None:
        # Imported here: models can only be imported once the registry is ready.
        from history import (
            checks,  # noqa: F401  (registers the system checks)
            depth_feed,
            lookups,
            worth_feed,
        )
        from history.importing import after_migrate
        from history.reader import after_request

        lookups.register()
        # The Go ks-scheduler's table, found in this very database, is imported
        # once after `migrate` (the init container runs it at every start).
        post_migrate.connect(after_migrate, sender=self, dispatch_uid="history-import")
        # The history cache's housekeeping runs once a reply is sent.
        request_finished.connect(after_request, dispatch_uid="history-cache-after")
        # So does the refresh of what warmth is worth to each pipeline.
        request_finished.connect(
            worth_feed.after_request, dispatch_uid="history-worth-after"
        )
        # And the read of the workspace depth the watcher measured.
        request_finished.connect(
            depth_feed.after_request, dispatch_uid="history-depth-after"
        )
