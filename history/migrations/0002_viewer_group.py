"""Create the view-only group: members browse history in the admin but edit nothing."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

GROUP_NAME = "ks-scheduler viewers"


def create_viewer_group(apps, schema_editor):
    # Permissions are normally created after all migrations; create them now so the
    # group can be given them on a fresh database.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name=GROUP_NAME)
    view_permissions = Permission.objects.filter(
        content_type__app_label="history", codename__startswith="view_"
    )
    group.permissions.add(*view_permissions)


def delete_viewer_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name=GROUP_NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("history", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_viewer_group, delete_viewer_group)]
