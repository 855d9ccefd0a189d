"""The HTTP API: ``create_app`` (Litestar), its typed bodies (``models``), the uvicorn runner
(``server``) and a client for out-of-process hosts (``client``). Importing this package imports
no torch; the app builds its container from settings when none is given."""
