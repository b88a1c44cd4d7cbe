"""Policies belong to label segments: a policy on a label-path key would never apply."""

from django.db import migrations, models

import history.models

POLICY_KEY_RULE = (
    "A segment of a pipeline label (jenkins, java, myapp): policies apply to the "
    "labels that contain it. Label-path keys (jenkins-java-*, ...$) hold history, "
    "not policies."
)


class Migration(migrations.Migration):
    dependencies = [
        ("history", "0013_label_path"),
    ]

    operations = [
        migrations.AlterField(
            model_name="keypolicy",
            name="key",
            field=models.CharField(
                help_text=POLICY_KEY_RULE,
                max_length=253,
                unique=True,
                validators=[history.models.validate_policy_key],
            ),
        ),
        migrations.AlterField(
            model_name="nodepolicy",
            name="key",
            field=models.CharField(
                help_text=POLICY_KEY_RULE,
                max_length=253,
                validators=[history.models.validate_policy_key],
            ),
        ),
    ]
