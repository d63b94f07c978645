"""ResourceSpec: AutoDist YAML, the local machine, a live Dask cluster's workers, what-if variants."""

from __future__ import annotations

import json

import pytest

import distlab as dl
from distlab import Link, ResourceSpec
from distlab.errors import ResourceError
from distlab.resources import available_cores, host_of

SPEC = """
nodes:
  - address: 10.0.0.1
    gpus: [0, 1]
    cpus: [0, 1, 2, 3]
    chief: true
    network_bandwidth: 100
    ssh_config: conf
  - address: 10.0.0.2
    cpus: [0, 1]
    network_bandwidth: 25
    ssh_config: conf
ssh:
  conf:
    username: root
    key_file: /root/.ssh/id_rsa
    python_venv: source /venv/bin/activate
"""


def load(tmp_path, text) -> ResourceSpec:
    path = tmp_path / "resource_spec.yml"
    path.write_text(text)
    return ResourceSpec.from_yaml(path)


def test_autodist_yaml(tmp_path):
    res = load(tmp_path, SPEC)
    assert [(r.rank, r.host, r.device) for r in res.ranks] == [
        (0, "10.0.0.1", "gpu:0"),
        (1, "10.0.0.1", "gpu:1"),
        (2, "10.0.0.2", "cpu:0"),
        (3, "10.0.0.2", "cpu:1"),
    ]
    assert res.cores == {"10.0.0.1": 4, "10.0.0.2": 2}
    assert res.links["inter"].bandwidth == pytest.approx(25e9 / 8)  # the slowest NIC, Gbit/s -> bytes/s
    assert res.ssh["conf"]["username"] == "root"
    assert res.nodes[0].chief and not res.nodes[1].chief
    assert res.hosts == ("10.0.0.1", "10.0.0.2")


def test_node_without_devices_gets_one_cpu_rank_and_first_node_leads(tmp_path):
    res = load(tmp_path, "nodes:\n  - address: localhost\n")
    assert [(r.host, r.device) for r in res.ranks] == [("localhost", "cpu:0")]
    assert res.nodes[0].chief


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ssh: {}\n", "nodes: missing or empty"),
        ("nodes: []\n", "nodes: missing or empty"),
        (
            "nodes:\n  - address: a\n  - address: b\n  - address: b\n",
            r"nodes\[2\].address: duplicate 'b' \(also nodes\[1\]\)",
        ),
        (
            "nodes:\n  - {address: a, chief: true}\n  - {address: b, chief: true}\n",
            r"nodes\[1\].chief: two chiefs",
        ),
        (
            "nodes:\n  - {address: a, network_bandwidth: -1}\n",
            r"nodes\[0\].network_bandwidth: must be a positive number",
        ),
        ("nodes:\n  - {address: a, gpu: [0]}\n", r"nodes\[0\]: unknown key 'gpu'; valid keys: address, gpus"),
        ("nodes:\n  - {address: a}\ncluster: x\n", "resource spec: unknown key 'cluster'"),
        ("nodes:\n  - {gpus: [0]}\n", r"nodes\[0\].address: missing"),
        ("nodes:\n  - {address: a, gpus: [0, 0]}\n", r"nodes\[0\].gpus: device listed twice"),
        ("nodes:\n  - {address: a, ssh_config: c}\n", r"nodes\[0\].ssh_config: 'c' is not a group under ssh"),
        ("nodes: [\n", "not valid YAML"),
    ],
)
def test_bad_yaml_names_the_field(tmp_path, text, message):
    with pytest.raises(ResourceError, match=message):
        load(tmp_path, text)


def test_missing_file(tmp_path):
    with pytest.raises(ResourceError, match="cannot read it"):
        ResourceSpec.from_yaml(tmp_path / "nope.yml")


def test_local():
    res = ResourceSpec.local(workers=3)
    assert [(r.host, r.device) for r in res.ranks] == [("127.0.0.1", f"cpu:{i}") for i in range(3)]
    assert res.cores == {"127.0.0.1": available_cores()}
    with pytest.raises(ResourceError, match="workers"):
        ResourceSpec.local(workers=0)


class FakeClient:
    """What ``Client.scheduler_info()`` returns, trimmed to the fields distlab reads."""

    def __init__(self, workers):
        self.workers = workers

    def scheduler_info(self):
        return {"workers": self.workers}


def test_from_client_orders_by_host_then_address():
    client = FakeClient(
        {
            "tcp://10.0.0.2:4000": {"host": "10.0.0.2", "nthreads": 2, "resources": {"GPU": 1}},
            "tcp://10.0.0.1:5000": {"host": "10.0.0.1", "nthreads": 1},
            "tcp://10.0.0.1:4000": {"nthreads": 1},
        }
    )
    res = ResourceSpec.from_client(client)
    assert res.addresses == ("tcp://10.0.0.1:4000", "tcp://10.0.0.1:5000", "tcp://10.0.0.2:4000")
    assert [(r.host, r.device) for r in res.ranks] == [
        ("10.0.0.1", "cpu:0"),
        ("10.0.0.1", "cpu:1"),
        ("10.0.0.2", "gpu:0"),
    ]
    assert res.cores == {"10.0.0.1": 2, "10.0.0.2": 2}
    with pytest.raises(ResourceError, match="no workers"):
        ResourceSpec.from_client(FakeClient({}))


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_from_real_local_cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with distributed.Client(cluster) as client:
            res = ResourceSpec.from_client(client)
    assert res.world == 2 and res.num_hosts == 1
    assert list(res.addresses) == sorted(res.addresses)


def test_host_of():
    assert host_of("tcp://10.0.0.2:4567") == "10.0.0.2"
    assert host_of("tcp://[::1]:4567") == "::1"
    assert host_of("inproc://10.1.2.3/1234/1") == "10.1.2.3/1234/1"  # no port: left as is


def test_with_links_and_with_world(tmp_path):
    res = load(tmp_path, SPEC)
    fast = res.with_links(inter=Link(1e-6, 1e11))
    assert fast.links["inter"].bandwidth == 1e11 and fast.links["intra"] == res.links["intra"]
    assert res.links["inter"].bandwidth == pytest.approx(25e9 / 8)  # unchanged: frozen copy
    eight = res.with_world(8)
    assert eight.world == 8 and eight.hosts == res.hosts and len(eight.ranks_on("10.0.0.1")) == 4
    grown = res.with_world(7, per_host=2)
    assert [len(grown.ranks_on(h)) for h in grown.hosts] == [2, 2, 2, 1]
    assert grown.cores["host-3"] == 4
    one = ResourceSpec.local(workers=2).with_world(1)
    assert one.world == 1


def test_fingerprint_dict_round_trip_and_html(tmp_path):
    res = load(tmp_path, SPEC)
    assert res.fingerprint() == load(tmp_path, SPEC).fingerprint()
    assert res.fingerprint() == res.with_links(intra=Link(1.0, 1.0)).fingerprint()  # links are not hardware
    assert res.fingerprint() != res.with_world(8).fingerprint()
    assert res.fingerprint().startswith("4r2h-")
    back = ResourceSpec.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back == res
    assert "10.0.0.2" in res._repr_html_()
    with pytest.raises(ResourceError, match="ranks"):
        ResourceSpec.from_dict({"links": {}})


def test_top_level_names():
    assert dl.ResourceSpec is ResourceSpec


def test_from_client_with_worker_facts():
    client = FakeClient(
        {"tcp://h:1": {"host": "h", "nthreads": 1}, "tcp://h:2": {"host": "h", "nthreads": 1}}
    )
    facts = {"tcp://h:1": {"cores": 8, "gpu": "1"}, "tcp://h:2": {"cores": 8, "gpu": None}}
    res = ResourceSpec.from_client(client, facts=facts)
    assert [r.device for r in res.ranks] == ["gpu:1", "cpu:0"]
    assert res.cores == {"h": 8}
    # plain workers on a GPU machine (a Lab without gpus=True) see the GPU in their metrics but
    # were given none: CPU ranks (seen on an H100: four "gpu" ranks on one device made NCCL refuse)
    seen = FakeClient(
        {f"tcp://h:{i}": {"host": "h", "nthreads": 1, "metrics": {"gpu": {"memory": 1}}} for i in (1, 2)}
    )
    plain = {f"tcp://h:{i}": {"cores": 16, "gpu": None} for i in (1, 2)}
    assert [r.device for r in ResourceSpec.from_client(seen, facts=plain).ranks] == ["cpu:0", "cpu:1"]
    assert [r.device for r in ResourceSpec.from_client(seen).ranks] == ["gpu:0", "gpu:1"]  # no facts: metrics
