from __future__ import annotations

from django.urls import path

from agents.web import views

urlpatterns = [
    path("runs/", views.runs, name="runs"),
    path("runs/new/", views.run_new, name="run_new"),
    path("runs/<int:run_id>/", views.run_detail, name="run_detail"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run_cancel"),
    path("runs/<int:run_id>/hold/", views.run_hold, name="run_hold"),
    path("runs/<int:run_id>/retry/", views.run_retry, name="run_retry"),
    path("runs/<int:run_id>/fork/", views.run_fork, name="run_fork"),
    path("runs/<int:run_id>/release/", views.run_release, name="run_release"),
    path("runs/<int:run_id>/export/", views.run_export, name="run_export"),
    path("runs/<int:run_id>/eval-case/", views.run_save_eval_case, name="run_save_eval_case"),
    path("runs/<int:run_id>/task.txt", views.run_text, {"part": "task"}, name="run_task_text"),
    path("runs/<int:run_id>/answer.txt", views.run_text, {"part": "answer"}, name="run_answer_text"),
    path("runs/<int:run_id>/messages/<int:index>.txt", views.run_message_text, name="run_message_text"),
    path("runs/<int:run_id>/grants/<int:grant_id>/revoke/", views.run_grant_revoke, name="run_grant_revoke"),
    path("account/notifications/", views.notifications, name="notifications"),
    # A Slack link's proof: Slack showed this URL to one member, after their signed click.
    path("account/slack/link/<str:token>/", views.slack_link, name="slack_link"),
]
