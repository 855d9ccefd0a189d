"""The HTTP API's paths: the prefix every route sits under and each route below it. No imports, so
that the client (``client.py``) and the app (``app.py``) name the same routes without the client
loading the server."""

BASE = "/v1/conductor/shadow"

# under BASE
ASK = "/ask"
STATUS = "/status"
NARRATE = "/narrate"
NARRATION = "/narration"
SESSIONS = "/sessions"
FEED = "/feed"
FEED_PROMPT = "/prompt"  # under FEED
FEED_OUTPUT = "/output"  # under FEED
HOST = "/host"
HOST_ARRIVED = "/arrived"  # under HOST, as the rest
HOST_STARTED = "/started"
HOST_FIRST_TOKEN = "/first-token"
HOST_ROUND_ENDED = "/round-ended"
HOST_FINISHED = "/finished"
HOST_HOLDS = "/holds"
