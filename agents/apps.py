from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from agents import claims

        # A reviewer who logs out holds no claim (docs/reviewing.md#claims).
        user_logged_out.connect(claims.on_logout, dispatch_uid="airlock.claims.on_logout")
