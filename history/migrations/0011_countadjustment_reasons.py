# The reasons of a count adjustment: node_replaced (never written) dropped,
# node_gone added.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("history", "0010_pod_log"),
    ]

    operations = [
        migrations.AlterField(
            model_name="countadjustment",
            name="reason",
            field=models.CharField(
                choices=[
                    ("admin_edit", "edited in the admin"),
                    ("reset", "reset to zero"),
                    ("halved", "halved"),
                    ("deleted", "row deleted"),
                    ("pruned", "ledger rows pruned"),
                    ("imported", "imported from the Go ks-scheduler"),
                    ("node_gone", "node gone (rows removed)"),
                ],
                max_length=16,
            ),
        ),
    ]
