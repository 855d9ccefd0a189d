"""``shadow status`` for a person at a terminal: the status as lines and a table."""

from __future__ import annotations

import re

from shadow.adapters.records import Status

# C0 and C1 controls and DEL: ESC sequences could clear the screen, set the title or write the
# clipboard (OSC 52) of the operator's terminal; a session's name or an error holds what a client sent
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters shown as escapes (``\x1b``), never sent to the terminal."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def table(rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, a rule under the first row."""
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def status_table(st: Status) -> str:
    """``GET .../status``: the model, the windows, one row per session."""
    slot, w, grid, store = st.slot, st.windows, st.slot.grid, st.store
    cap = store.cap_bytes if store is not None else None
    lines = [f"model: {slot.state}{' (' + slot.error + ')' if slot.error else ''}, {slot.model or '-'} "
             f"on {slot.device} ({slot.dtype}, grid {grid})",
             f"read: idle window {w.idle.chunks} chunks ({w.idle.spent_ms:.0f} ms), ration "
             f"{w.ration.chunks} chunks ({w.ration.spent_ms:.0f} ms); narrator "
             f"{st.narrator.spent_ms if st.narrator is not None else 0.0:.0f} ms",
             f"resident: {(store.resident_bytes if store is not None else 0) / 2**20:.1f} MiB of "
             f"{'no cap' if cap is None else f'{cap / 2**20:.1f} MiB'}; backlog {st.backlog} ids; "
             f"host: {st.host.running} running, {st.host.waiting} waiting"]
    if len(slot.batches) > 1:  # the batch sizes a pass may take, and any the warm-up check refused
        ok = [b for b, why in slot.batches.items() if why in ("ok", "unchecked")]
        lines.append(f"batches: up to {slot.max_batch} sessions a pass (sizes {', '.join(ok)})"
                     + "".join(f"; size {b} not used: {why}" for b, why in slot.batches.items() if b not in ok))
    rows = [["session", "where", "ids", "read", "behind", "fresh", "rollbacks", "MiB resident", "MiB on disk",
             "profile"]]
    for name, s in sorted(st.sessions.items()):
        rows.append([name, s.where, str(s.ids), str(s.committed), str(s.backlog),
                     "yes" if s.backlog < grid else "no", str(s.rollbacks),
                     f"{s.bytes_resident / 2**20:.1f}", f"{s.bytes_on_disk / 2**20:.1f}", s.profile or "-"])
    return "\n".join(map(printable, lines)) + "\n\n" + (table(rows) if len(rows) > 1 else "no sessions")
