# When a Slack member id was linked (issue 46, item 2): a click on a message sent
# before then decides nothing.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("agents", "0030_agentprofile_expose_names"),
    ]

    operations = [
        migrations.AddField(
            model_name="notificationpreference",
            name="slack_linked_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
