from django.apps import AppConfig
from django.db.models.signals import post_migrate


class HistoryConfig(AppConfig):
    name = "history"
    verbose_name = "Pipeline history"

    def ready(self):
        # Imported here: models can only be imported once the registry is ready.
        from history.importing import after_migrate

        # The Go ks-scheduler's table, found in this very database, is imported
        # once after `migrate` (the init container runs it at every start).
        post_migrate.connect(after_migrate, sender=self, dispatch_uid="history-import")
