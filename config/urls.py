from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from agents import views as agent_views

urlpatterns = [
    path("", agent_views.overview, name="overview"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    # -- runs: list, timeline, launch (issue #5) --
    path("", include("agents.urls")),
]
