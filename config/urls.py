from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from agents.accounts import login as login_views
from agents.accounts import sso
from agents.api import urlpatterns as api_urlpatterns
from agents.gateway.bridge import gateway_view
from agents.web import views as agent_views
from agents.web import views_demo
from reviews import slack as slack_views

urlpatterns = [
    # The JSON API (django-ninja); its own JSON 404 catches anything else under /api/.
    # First: every agent's call is one of these, and Django tries the patterns in order,
    # building a list of each one it tried (about 0.2 ms a request behind the pages'
    # patterns, issue #48). No other pattern starts with a converter, so none could
    # match an /api/ path anyway.
    path("api/", include((api_urlpatterns(), "ninja"), namespace="api")),
    path("", agent_views.overview, name="overview"),
    path("login/", login_views.login, name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    # Single sign-on (agents/accounts/sso.py): only allauth's OpenID Connect login and callback,
    # never its local signup or password pages. The callback is ours (it checks the ID
    # token's signature), at allauth's path and name, so it comes first.
    path(
        "accounts/oidc/<str:provider_id>/login/callback/", sso.callback, name="openid_connect_callback"
    ),
    path("accounts/", include("allauth.socialaccount.providers.openid_connect.urls")),
    # Runs: list, timeline, launch, cancel, export.
    path("", include("agents.web.urls")),
    # The review queue: a UI over agents' approvals.
    path("reviews/", include("reviews.urls")),
    # Slack's interactivity Request URL: button clicks on approval messages.
    path("integrations/slack/interactions", slack_views.interactions, name="slack_interactions"),
    # The MCP gateway (docs/gateway.md); the slash is optional, as MCP clients are given a URL.
    re_path(r"^mcp/(?P<profile>[A-Za-z0-9_-]{1,64})/?$", gateway_view, name="mcp_gateway"),
]

# The built-in demo web site: the pages http_get serves for demo.airlock.internal, for people.
urlpatterns += [
    path("demo-site/", views_demo.demo_site, name="demo_site"),
    path("demo-site/<slug:page>/", views_demo.demo_site, name="demo_site_page"),
]

# A database that is down answers 503 even when the error escaped every middleware.
handler500 = "agents.ops.unavailable.server_error"
# 400, 403 and 404 in the site layout, saying why and offering a way back (JSON under /api/).
handler400 = "agents.web.errors.bad_request"
handler403 = "agents.web.errors.permission_denied"
handler404 = "agents.web.errors.page_not_found"
