from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every import here is late on purpose: Django imports this module while it fills
        # the app registry, before any model may be imported; ready() runs once it is full.
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_save

        from agents.accounts import members

        post_save.connect(members.on_user_saved, sender=get_user_model(), dispatch_uid="airlock.person_leave")
        from django.contrib.auth.signals import user_logged_out

        from agents.actions import claims

        # A reviewer who logs out holds no claim (docs/reviewing.md#claims).
        user_logged_out.connect(claims.on_logout, dispatch_uid="airlock.claims.on_logout")

        from agents import tools
        from agents.models import runs

        # A profile's clean() checks its tool names against these (agents/models/runs.py
        # says why they are handed over here, not imported there).
        runs.unknown_tools, runs.local_tool_names = tools.unknown_names, tools.local_names
        # `manage.py check` lists profile rows that no longer validate (importing
        # agents.ops.checks registers it); the pool checks a connection it hands out
        # without a round trip (agents/ops/pool.py).
        from agents.ops import checks, pool  # noqa: F401

        pool.install()
