"""An OpenAI-compatible proxy that puts the shadow in front of any engine (see ``shadow.proxy.app``)."""

from .app import ProxyApp, create_proxy_app

__all__ = ["ProxyApp", "create_proxy_app"]
