"""ASGI entry point: Django for HTTP, Channels for the chat stream and websockets.

Every protocol passes the Host check first (``meshnet_site.asgi_guards``), then
bodies are bounded on their headers (``meshnet_site.asgi_limits``).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "meshnet_site.settings")

# Django must be set up before anything imports models (the routing below).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from meshnet_site.asgi_guards import AllowedHostsGuard  # noqa: E402
from meshnet_site.asgi_limits import BoundedBodies  # noqa: E402
from tracker_app.completions.consumer import (  # noqa: E402
    ChatCompletionsConsumer,
    MessagesConsumer,
    ResponsesConsumer,
    TextCompletionsConsumer,
)
from tracker_app.dashboard.websocket_urls import websocket_urlpatterns  # noqa: E402

router = ProtocolTypeRouter(
    {
        # The completion endpoints stream through Channels consumers; the rest is Django.
        "http": URLRouter(
            [
                path("v1/chat/completions", ChatCompletionsConsumer.as_asgi()),
                path("v1/completions", TextCompletionsConsumer.as_asgi()),
                path("v1/messages", MessagesConsumer.as_asgi()),
                path("v1/responses", ResponsesConsumer.as_asgi()),
                re_path(r"", django_asgi_app),  # type: ignore[arg-type]  # an ASGI app, as URLRouter allows
            ]
        ),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)

# The Host check stays outermost: a request for a host this deployment does not
# serve is refused before anything else looks at it. Then bodies are bounded on
# their headers before anything reads them (runtracker's daphne refuses them
# earlier still, before receiving them).
application = AllowedHostsGuard(BoundedBodies(router, limit=settings.MESHNET_MAX_REQUEST_BYTES))
