"""Shadow rules (docs/policy.md#shadow-rules): an approval records what the profile's
shadow rules would have decided about its call."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("agents", "0017_retention")]

    operations = [
        migrations.AddField(
            model_name="approval",
            name="shadow",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text='what the profile\'s shadow rules would have decided: [{"rule", "verdict"}]',
            ),
        ),
    ]
