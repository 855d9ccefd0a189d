"""The live page for a person: ``GET /`` (on the proxy ``GET /v1/conductor/shadow``), its sessions as an
HTML fragment (``GET .../live``, refreshed every 2 s), its own script and style, and its token form.

- The page holds no data, so it loads without the token. When its first read answers 401 it shows
  a form that posts the token to ``.../token``; the server answers with an HttpOnly, SameSite=Strict
  cookie (no script can read it, no other site's request carries it), which the guard takes on the
  page's own reads only (``PAGE_READS``).
- It says what it runs on (the device and attention kernel the reader resolved, not the setting),
  the narrator's state (off, on, summaries skipped), each session with a fresh column, a legend and
  units, the sessions in a turn now and when each was last fed; on the proxy a proxy section
  (upstream, engine, turns, mismatches, unreachable).
- When a read or the narration stream fails it says so at once: a "disconnected since HH:MM:SS"
  banner, the data greyed, until the service answers again. No uncaught error reaches the console.
- A small plot draws the fresh share and the device share over the last 15 minutes, from the status
  it reads every 2 s (``page.js``).

The script and the style are files under ``templates/`` served as they are: the page's
Content-Security-Policy (``guard.py``) lets no inline script or style run.
"""

from __future__ import annotations

import hmac
import time
from typing import Any
from urllib.parse import parse_qs

from litestar import Controller, MediaType, Request, Response, get, post
from litestar.datastructures import Cookie
from litestar.response import Template

from shadow.adapters.logs import runs_on
from shadow.adapters.records import Status
from shadow.adapters.service import ShadowService

from .operators import ASSETS, COOKIE_PATH, LOGIN_PATH, PAGE_PATHS, TEMPLATES, TOKEN_COOKIE
from .paths import BASE


def _mb(n: float | None) -> str:
    return "none" if n is None else f"{n / 2**20:,.1f} MiB"


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    return f"{seconds / 60:.0f} min ago" if seconds < 7200 else f"{seconds / 3600:.0f} h ago"


def narrator_state(status: Status) -> str:
    """``off`` (no profile narrates), ``on``, or ``on, N skipped`` (summaries dropped, by reason)."""
    if not any(b.narrator == "on" for b in status.profiles.profiles.values()) or status.narrator is None:
        return "off"
    skipped = status.narrator.skipped
    n = sum(skipped.values())
    if not n:
        return f"on, {status.narrator.summaries} written"
    why = ", ".join(f"{k} {v}" for k, v in sorted(skipped.items()) if v)
    return f"on, {status.narrator.summaries} written, {n} skipped ({why})"


def live_context(status: Status, device: str = "", kernel: str = "", now: float | None = None) -> dict[str, Any]:
    """What the page's fragment shows, from the status: what it runs on, each session, the windows,
    the cap. ``now``: the monotonic clock the sessions' ``last_used`` were taken on."""
    now = time.monotonic() if now is None else now
    router: dict[str, str] = {}
    for r in status.router.last if status.router is not None else []:  # oldest first: the last of each stays
        router[r.session] = (r.label if isinstance(r.label, str) else "") or (r.error if isinstance(r.error, str)
                                                                              else "")
    in_turn = {t.session for t in status.host.turns if t.finished_s is None and t.session}
    grid = status.slot.grid
    sessions = [{"name": name, "where": s.where, "ids": s.ids, "committed": s.committed, "behind": s.backlog,
                 "fresh": s.backlog < grid, "in_turn": name in in_turn,
                 "fed": _ago(now - s.last_used if s.last_used else None),
                 "router": router.get(name, ""), "profile": s.profile or ""}
                for name, s in sorted(status.sessions.items())]
    w, store = status.windows, status.store
    return {"sessions": sessions, "slot": status.slot, "grid": grid,
            "device": device or f"{status.slot.device} (not resolved yet)", "kernel": kernel or "-",
            "fresh": sum(s["fresh"] for s in sessions), "in_turn": len(in_turn),
            "ration_ms": w.ration.spent_ms, "idle_ms": w.idle.spent_ms,
            "narrator_ms": status.narrator.spent_ms if status.narrator is not None else 0.0,
            "narrator": narrator_state(status),
            "cap": _mb(store.cap_bytes if store is not None else None),
            "resident": _mb(store.resident_bytes if store is not None else 0), "backlog": status.backlog,
            "at": time.strftime("%H:%M:%S UTC", time.gmtime())}


class PageController(Controller):
    tags = ("operators",)

    @get(sorted(PAGE_PATHS - {BASE + "/"}), media_type=MediaType.HTML, include_in_schema=True,
         summary="The live page: each session, the narration as it comes")
    async def page(self, request: Request[Any, Any, Any], service: ShadowService) -> Template:
        return Template("live.html", context={"base": BASE, "login": LOGIN_PATH, "here": request.url.path,
                                              "wrong": request.query_params.get("token") == "wrong"})

    @get([f"{BASE}/{name}" for name in ASSETS], include_in_schema=False)
    async def asset(self, request: Request[Any, Any, Any]) -> Response[bytes]:
        name = request.url.path.rsplit("/", 1)[1]
        return Response((TEMPLATES / name).read_bytes(), media_type=ASSETS[name],
                        headers={"cache-control": "no-cache"})

    @post(LOGIN_PATH, include_in_schema=False, status_code=303)
    async def login(self, request: Request[Any, Any, Any], service: ShadowService) -> Response[bytes]:
        """The page's token form (a same-origin form POST, ``guard.py``): the right token gets the
        cookie (HttpOnly: no script reads it; SameSite=Strict: no other site's request carries it)
        and a 303 back to the page; a wrong one a 303 to the page that says so."""
        form = parse_qs((await request.body()).decode("latin-1"))
        given = form.get("token", [""])[0].strip()
        back = form.get("next", [BASE])[0]
        back = back if back in PAGE_PATHS else BASE  # never a redirect elsewhere
        token = service.settings.token
        if not (token and hmac.compare_digest(given.encode("latin-1", "replace"), token.encode("latin-1",
                                                                                              "replace"))):
            return Response(b"", status_code=303, headers={"location": back + "?token=wrong",
                                                           "cache-control": "no-store"})
        cookie = Cookie(key=TOKEN_COOKIE, value=given, path=COOKIE_PATH, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
        return Response(b"", status_code=303, headers={"location": back, "cache-control": "no-store"},
                        cookies=[cookie])

    @get(BASE + "/live", media_type=MediaType.HTML, sync_to_thread=True,
         summary="The live page's sessions, as an HTML fragment")
    def live(self, service: ShadowService) -> Template:
        device, kernel = runs_on(service.live)
        return Template("live_sessions.html", context=live_context(service.status(), device, kernel))
