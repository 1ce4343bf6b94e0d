from django.urls import path

from nodes_app import api

urlpatterns = [
    path("register", api.RegisterNodeApi.as_view(), name="node-register"),
    path("<str:node_id>/heartbeat", api.HeartbeatNodeApi.as_view(), name="node-heartbeat"),
    path("<str:node_id>/deregister", api.DeregisterNodeApi.as_view(), name="node-deregister"),
]
