"""The one place that builds shadow's object graph from settings and picks its backends.

Backends are imported inside the factories, so building the container with the shadow off
imports no torch. Tests override providers (``container.reader.override(...)``) instead of patching.

The service's part (below ``shadow``): the profiles, the host's activity and locks (a host that
shares its own locks overrides ``activity``), the tracer provider (a ``Resource``: flushed and shut
down by ``shutdown_resources``) and the telemetry over it, the model's slot (it builds ``shadow``
lazily, in an idle window), the two schedulers, the router's shadow mode, the narrator, and the
service object that the API and an in-process host use.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Literal

from dependency_injector import containers, providers

from shadow.core.errors import BadInput
from shadow.core.settings import ShadowSettings
from shadow.core.shadow import Shadow

if TYPE_CHECKING:  # concrete types for the checker only: importing them here would import torch
    from opentelemetry.sdk.trace import TracerProvider

    from shadow.adapters.metrics import Metrics
    from shadow.adapters.narrator import Narrator
    from shadow.adapters.prompter import QwenPrompter
    from shadow.adapters.router import RouterShadow
    from shadow.adapters.service import ShadowService
    from shadow.backends.qwen35 import Qwen35
    from shadow.backends.reader import TorchReader
    from shadow.backends.schedulers import IdleScheduler, RationedScheduler
    from shadow.backends.stores import DiskStore, MemoryStore
    from shadow.backends.stores.redis_leases import RedisLeases
    from shadow.backends.stores.tiered import TieredStore
    from shadow.core.host import HostActivity
    from shadow.core.profiles import Profiles
    from shadow.core.scheduling import Telemetry
    from shadow.core.slot import Slot

OnOff = Literal["on", "off"]


def triton_cache(settings: ShadowSettings, environ: dict[str, str] | None = None) -> str:
    """Triton's kernel cache under DIR (``DIR/triton``), so a restart finds what the last start
    compiled, unless the user set ``TRITON_CACHE_DIR``; set before anything compiles. Returns it."""
    env = os.environ if environ is None else environ
    return env.setdefault("TRITON_CACHE_DIR", str(settings.home / "triton"))


def _model(settings: ShadowSettings) -> Qwen35:
    if not settings.model:
        raise BadInput("QWEN38_SHADOW_MODEL is empty: the shadow is off")
    triton_cache(settings)
    import torch

    from shadow.backends.qwen35 import Qwen35

    device = settings.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return Qwen35.from_pretrained(settings.model, device=device, dtype=settings.dtype)


def _reader(model: Qwen35, settings: ShadowSettings, timer: Callable[[], float]) -> TorchReader:
    from shadow.backends.reader import TorchReader

    cuda = model.device.type == "cuda"
    fast = settings.fast == "on" or (settings.fast == "auto" and cuda)
    return TorchReader(model, settings.grid, fast=fast, timer=timer, stream=settings.stream,
                       spans=settings.span_sizes(cuda and fast) if fast else ())


DEFAULT_DISK = "~/.qwen38-spark-engine/cache/shadow"
DISK_OFF = ("", "off", "none")


def _memory() -> MemoryStore:
    from shadow.backends.stores import MemoryStore

    return MemoryStore()


def _disk_kind(settings: ShadowSettings) -> OnOff:
    return "off" if settings.disk.strip().lower() in DISK_OFF else "on"


def _disk(settings: ShadowSettings, reader: TorchReader, telemetry: Telemetry) -> DiskStore:
    """Parked files under DISK, one folder per model (by weights hash), so models never touch each
    other's sessions."""
    from pathlib import Path

    from shadow.backends.stores import DiskStore

    root = Path(DEFAULT_DISK if settings.disk == "auto" else settings.disk).expanduser()
    digest = reader.weights_hash
    return DiskStore(root / digest[:16], reader, digest, max_bytes=int(settings.disk_gb * 2**30), telemetry=telemetry)


# ---- the shared store (STORE: docs/scale-out.md) -----------------------------------------------


def _store_kind(settings: ShadowSettings) -> Literal["local", "shared"]:
    if not settings.store:
        return "local"
    if _disk_kind(settings) == "off":
        raise BadInput("QWEN38_SHADOW_STORE needs QWEN38_SHADOW_DISK: the local disk is the shared store's fast tier")
    return "shared"


def _redis(settings: ShadowSettings) -> Iterator[object]:
    """The redis-py client of STORE (no connection is made until the first command); None without
    one (the container's resources start with the app, whatever the settings)."""
    if _store_kind(settings) == "local":
        yield None
        return
    import logging

    from shadow.backends.stores.redis_parks import connect, masked

    client = connect(settings.store, settings.store_password.get_secret_value(), cluster=settings.store_cluster)
    logging.getLogger(__name__).info("shared store %s (instance %s)", masked(settings.store), settings.instance_name)
    try:
        yield client
    finally:
        client.close()


def _leases(settings: ShadowSettings, client: object, reader: TorchReader, telemetry: Telemetry) -> RedisLeases:
    from shadow.backends.stores.redis_leases import RedisLeases
    from shadow.backends.stores.redis_parks import Keys, masked

    return RedisLeases(client, Keys(reader.weights_hash), settings.instance_name, lease_s=settings.lease_s,
                       url=masked(settings.store), telemetry=telemetry)


def _tiered(disk: DiskStore, client: object, leases: RedisLeases, telemetry: Telemetry, part_bytes: int) -> TieredStore:
    from shadow.backends.stores.redis_parks import Keys, RedisParks
    from shadow.backends.stores.tiered import TieredStore

    parks = RedisParks(client, Keys(disk.weights_hash), ttl_s=disk.ttl_s, part_bytes=part_bytes)
    return TieredStore(disk, parks, leases, telemetry)


def _prompter() -> QwenPrompter:
    from shadow.adapters.prompter import QwenPrompter

    return QwenPrompter()


def _shadow(reader: TorchReader, prompter: QwenPrompter, memory: MemoryStore, disk: DiskStore | TieredStore | None,
            settings: ShadowSettings, telemetry: Telemetry, leases: RedisLeases | None) -> Shadow:
    # Concrete types in, protocols out: the checker verifies each backend against its Protocol here.
    return Shadow(reader, prompter, memory=memory, disk=disk, cap_bytes=int(settings.gb * 2**30),
                  max_sessions=settings.max_sessions, telemetry=telemetry, leases=leases)


# ---- the service -------------------------------------------------------------------------------


def _profiles(settings: ShadowSettings) -> Profiles:
    from shadow.core.profiles import load_profiles

    return load_profiles(settings.profiles, settings.narrator)


def _trace_kind(settings: ShadowSettings) -> OnOff:
    return "on" if settings.trace_exporters else "off"


def _tracer_provider(settings: ShadowSettings) -> Iterator[TracerProvider | None]:
    from shadow.adapters.telemetry import tracer_provider

    yield from tracer_provider(settings)


def _telemetry(provider: TracerProvider | None, settings: ShadowSettings, metrics: Metrics) -> Telemetry:
    from shadow.adapters.metrics import MeteredTelemetry
    from shadow.adapters.telemetry import telemetry

    return MeteredTelemetry(telemetry(provider, settings), metrics)


def _metrics(settings: ShadowSettings) -> Metrics:
    from shadow.adapters.metrics import Metrics

    return Metrics(settings.grid, int(settings.gb * 2**30))


def _slot(settings: ShadowSettings, shadow: Callable[[], Shadow], profiles: Profiles,
          clock: Callable[[], float], metrics: Metrics) -> Slot:
    from shadow.core.slot import Slot

    slot = Slot(shadow if settings.on else None, model=settings.model, wanted=profiles.any_on,
                shared_with=("narrator",) if settings.shares_narrator_slot else (), clock=clock)
    metrics.watch(slot.get)  # the gauges read the facade once it is loaded and warmed
    return slot


def _router(settings: ShadowSettings, clock: Callable[[], float], telemetry: Telemetry) -> RouterShadow:
    from shadow.adapters.router import RouterShadow

    return RouterShadow(settings.home / "shadow.jsonl", clock, telemetry)


def _narrator(slot: Slot, settings: ShadowSettings, clock: Callable[[], float], telemetry: Telemetry,
              ration: RationedScheduler, timer: Callable[[], float]) -> Narrator:
    from shadow.adapters.narrator import Narrator

    return Narrator(slot, settings.narrator_instruction, settings.narrator_share, settings.narrator_max_tokens,
                    clock, telemetry, chunk_cost=ration.estimate, max_turns=settings.max_arrived, timer=timer)


def _idle(slot: Slot, activity: HostActivity, telemetry: Telemetry, clock: Callable[[], float],
          settings: ShadowSettings, router: RouterShadow) -> IdleScheduler:
    from shadow.backends.schedulers import IdleScheduler

    return IdleScheduler(slot, activity, telemetry, clock, window_s=settings.idle_window_s,
                         lock_wait_s=settings.idle_poll_s, questions=router)


def _ration(slot: Slot, activity: HostActivity, telemetry: Telemetry, clock: Callable[[], float],
            settings: ShadowSettings) -> RationedScheduler:
    from shadow.backends.schedulers import RationedScheduler

    return RationedScheduler(slot, activity, telemetry, clock, share=settings.ration,
                             slice_s=settings.slice_ms / 1e3, scope=settings.ration_scope,
                             gather=settings.ration_gather, gather_s=settings.ration_gather_ms / 1e3,
                             thread=settings.ration_thread, output_turns=settings.ration_output_turns)


def _activity(clock: Callable[[], float]) -> HostActivity:
    from shadow.core.host import HostActivity

    return HostActivity(clock=clock)


def _service(settings: ShadowSettings, slot: Slot, activity: HostActivity, profiles: Profiles, idle: IdleScheduler,
             ration: RationedScheduler, telemetry: Telemetry, router: RouterShadow,
             clock: Callable[[], float], narrator: Narrator) -> ShadowService:
    from shadow.adapters.service import ShadowService

    return ShadowService(settings, slot, activity, profiles, idle, ration, telemetry, router, clock=clock,
                         narrator=narrator)


class Container(containers.DeclarativeContainer):
    settings = providers.Dependency(instance_of=ShadowSettings)
    # what every part reports to: spans (when traces are on) and Prometheus' metrics
    tracer_provider = providers.Selector(providers.Callable(_trace_kind, settings),
                                         on=providers.Resource(_tracer_provider, settings),
                                         off=providers.Object(None))
    metrics = providers.Singleton(_metrics, settings)
    telemetry = providers.Singleton(_telemetry, tracer_provider, settings, metrics)
    model = providers.Singleton(_model, settings)
    reader_timer = providers.Object(time.perf_counter)  # what a chunk's cost is measured with (tests inject one)
    reader = providers.Singleton(_reader, model, settings, reader_timer)
    prompter = providers.Singleton(_prompter)
    memory = providers.Singleton(_memory)
    disk = providers.Selector(providers.Callable(_disk_kind, settings),
                              on=providers.Singleton(_disk, settings, reader, telemetry), off=providers.Object(None))
    # with STORE: the disk in front of the shared Redis, and the leases that hold a session to one instance
    redis = providers.Resource(_redis, settings)
    store_part_bytes = providers.Object(8 * 2**20)  # a park's parts in the store (tests inject smaller ones)
    leases = providers.Selector(providers.Callable(_store_kind, settings),
                                shared=providers.Singleton(_leases, settings, redis, reader, telemetry),
                                local=providers.Object(None))
    parked = providers.Selector(providers.Callable(_store_kind, settings),
                                shared=providers.Singleton(_tiered, disk, redis, leases, telemetry,
                                                          store_part_bytes), local=disk)
    shadow = providers.Singleton(_shadow, reader, prompter, memory, parked, settings, telemetry, leases)

    # ---- the service (see the module docstring) ----
    clock = providers.Object(time.monotonic)
    profiles = providers.Singleton(_profiles, settings)
    activity = providers.Singleton(_activity, clock)
    slot = providers.Singleton(_slot, settings, shadow.provider, profiles, clock, metrics)
    router = providers.Singleton(_router, settings, clock, telemetry)
    idle = providers.Singleton(_idle, slot, activity, telemetry, clock, settings, router)
    ration = providers.Singleton(_ration, slot, activity, telemetry, clock, settings)
    narrator = providers.Singleton(_narrator, slot, settings, clock, telemetry, ration, reader_timer)
    service = providers.Singleton(_service, settings, slot, activity, profiles, idle, ration, telemetry, router,
                                  clock, narrator)


def build_container(settings: ShadowSettings) -> Container:
    return Container(settings=settings)
