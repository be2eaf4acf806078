from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("agents", "0029_review_tally_version"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentprofile",
            name="expose_names",
            field=models.BooleanField(
                default=False,
                help_text="external profiles whose tools are one MCP server's (SERVER__* or SERVER__tool entries "
                "only): the MCP gateway lists them under the server's own names, without the SERVER__ prefix",
            ),
        ),
    ]
