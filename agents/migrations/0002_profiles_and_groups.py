"""The profiles and groups that exist after `migrate` (fixed names of the design)."""

from django.db import migrations


def forwards(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    from agents.defaults import ensure

    # Permissions are normally created after migrate; the groups need them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    ensure(apps.get_model("agents", "AgentProfile"), apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"))


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
