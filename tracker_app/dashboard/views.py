"""The dashboard's pages: the live dashboard (staff only) and its sign-in."""

from __future__ import annotations

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from tracker_app.dashboard.snapshot import dashboard_snapshot


@never_cache
@staff_member_required(login_url="dashboard-login")
def dashboard_page(request: HttpRequest) -> HttpResponse:
    """The five tabs, drawn from a snapshot embedded in the page, then kept live by
    the websocket (``/ws/dashboard/``). Anyone but active staff goes to the sign-in."""
    return render(request, "dashboard/index.html", {"snapshot": dashboard_snapshot()})


class DashboardLoginView(LoginView):
    """Sign-in for staff accounts only (the admin's form refuses the others)."""

    template_name = "dashboard/login.html"
    authentication_form = AdminAuthenticationForm
    next_page = "dashboard"
