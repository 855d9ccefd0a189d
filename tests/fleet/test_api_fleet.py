"""The API of an instance in a fleet: a session held by another instance answers 409 naming it;
``/ready`` and ``/metrics`` say whether the shared store answers (still ready when it does not:
sessions are then followed here, unshared)."""

from __future__ import annotations

from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from shadow.api.app import BASE, create_app
from shadow.backends.stores.redis_parks import Keys
from tests.conftest import ids, make_container, make_settings

LOCAL = "http://127.0.0.1"


def gauges(client: TestClient) -> dict[str, float]:
    r = client.get("/metrics")
    assert r.status_code == 200
    return {s.name: s.value for f in text_string_to_metric_families(r.text) for s in f.samples}


def test_409_naming_the_holder_and_ready_says_when_the_store_is_down(checkpoint, tmp_path, redis_node):
    c = make_container(make_settings(checkpoint, tmp_path, disk=str(tmp_path / "disk"), store=redis_node.url,
                                     instance="A", lease_s=1.0))
    with TestClient(create_app(c, start_idle_loop=False), base_url=LOCAL) as client:
        c.service().idle_step()  # the model loaded and warmed
        keys = Keys(c.reader().weights_hash)
        redis_node.cli("SET", keys.lease("s"), "gpu-7:4242:3", "PX", "60000")  # another instance's lease
        r = client.post(BASE + "/feed/prompt", json={"session": "s", "prompt": ids(100)})
        assert r.status_code == 409 and "held by instance 'gpu-7:4242'" in r.json()["detail"], r.text
        r = client.get("/ready")
        assert r.status_code == 200 and r.json()["store"] == "up"
        assert gauges(client)["shadow_store_up"] == 1

        redis_node.kill()
        r = client.post(BASE + "/feed/prompt", json={"session": "t", "prompt": ids(100)})
        assert r.status_code == 200, r.text  # followed here, unshared
        r = client.get("/ready")
        assert r.status_code == 200 and r.json()["store"] == "down" and "unshared" in r.json()["reason"]
        g = gauges(client)
        assert g["shadow_store_up"] == 0 and g["shadow_sessions_unshared"] == 1
        sharing = client.get(BASE + "/status").json()["store"]["sharing"]
        assert sharing["store"] == "down" and sharing["instance"] == "A" and sharing["unshared"] == 1
