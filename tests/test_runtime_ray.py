"""``runtime.backend: ray`` on a real local Ray cluster: the same records as the local backend,
envs in worker actors, engine replicas behind a sticky router, versioned weight sync, workers that
die mid-rollout, placement that cannot be met, and an address that does not answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

ray = pytest.importorskip(
    "ray", reason="Ray is an optional extra (pip install 'horizonrl[ray]'); make setup installs it"
)

from horizonrl.config import load_config  # noqa: E402
from horizonrl.envs.factory import make_tasks  # noqa: E402
from horizonrl.errors import ConfigError, HorizonError  # noqa: E402
from horizonrl.local_server import free_port  # noqa: E402
from horizonrl.rollout.runner import run_rollouts  # noqa: E402
from horizonrl.train.runtime import build_runtime  # noqa: E402
from horizonrl.train.workers import worker_backend  # noqa: E402

TESTS = os.path.dirname(os.path.abspath(__file__))
TINY = [
    "model.path=tiny-random",
    "model.dtype=float32",
    "engine.dtype=float32",
    "sampling.max_new_tokens=12",
    "sampling.seed=3",
    "agent.max_turns=3",
    "agent.max_malformed=3",
]
RAY = [
    "runtime.backend=ray",
    "runtime.env_worker_cpus=0.25",
    "runtime.engine_cpus=0.5",
    "runtime.placement_timeout_s=60",
]


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the module (each run's backend joins it); its workers can import
    the tests' own envs (``toy_envs``)."""
    path = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        address="local",  # a cluster of its own, whatever else runs on the machine
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        namespace="horizonrl-tests",
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    yield
    ray.shutdown()


def _rollout(config, n_tasks=6, samples=2):
    runtime = build_runtime(config)
    try:
        tasks = make_tasks(config.env, "train", n_tasks, 0)
        result = asyncio.run(run_rollouts(runtime.agent, runtime.backend.env_factory(), tasks, samples, 12))
        return runtime, list(result)
    except BaseException:
        runtime.close()
        raise


def test_ray_rollouts_equal_local_ones(cluster):
    """Greedy, so that the records do not depend on float rounding across processes (a sampled
    token near a boundary of the sampling CDF can flip with the last bit of a logit)."""
    greedy = [*TINY, "sampling.temperature=0"]
    local_rt, local = _rollout(load_config("configs/calc.yaml", greedy))
    local_rt.close()
    ray_rt, remote = _rollout(load_config("configs/calc.yaml", [*greedy, *RAY]))
    where = ray_rt.backend.where()
    ray_rt.close()
    assert len(local) == len(remote) == 12
    for a, b in zip(local, remote, strict=True):
        assert (a.id, a.finish, a.reward, a.num_turns) == (b.id, b.finish, b.reward, b.num_turns)
        assert (
            a.prompt_ids == b.prompt_ids and a.response_ids == b.response_ids and a.loss_mask == b.loss_mask
        )
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert [m.content for m in a.messages] == [m.content for m in b.messages]
    assert len(where["env_workers"]) == 2 and len(where["engine_replicas"]) == 1
    assert all(w["pid"] != os.getpid() for w in where["env_workers"])  # the envs lived in the workers


def test_two_replicas_share_the_load_and_keep_conversations_sticky(cluster):
    config = load_config("configs/calc.yaml", [*TINY, *RAY, "runtime.engine_replicas=2"])
    runtime, trajs = _rollout(config, n_tasks=8, samples=2)
    try:
        stats = runtime.engine.stats
        per = ray.get([r.stats.remote() for r in runtime.engine.replicas])
    finally:
        runtime.close()
    assert len(trajs) == 16 and stats["replicas"] == 2
    assert all(p["requests"] > 0 for p in per)  # both replicas served
    later_turns = sum(max(t.num_turns - 1, 0) for t in trajs)
    assert stats["routed_sticky"] == later_turns  # every later turn went where its conversation was
    assert stats["conversation_reused_tokens"] > 0


def test_weight_sync_is_versioned_and_no_sample_mixes_versions(cluster):
    config = load_config("configs/calc.yaml", [*TINY, *RAY, "runtime.engine_replicas=2"])
    runtime = build_runtime(config)
    try:
        assert runtime.engine.weights_version == 1  # the policy sent at start
        tasks = make_tasks(config.env, "train", 4, 0)
        before = asyncio.run(run_rollouts(runtime.agent, runtime.backend.env_factory(), tasks, 2, 8))
        runtime.engine.update_weights(_perturbed(config))
        after = asyncio.run(run_rollouts(runtime.agent, runtime.backend.env_factory(), tasks, 2, 8))
    finally:
        runtime.close()
    for trajs, version in ((before, 1.0), (after, 2.0)):
        for t in trajs:
            assert t.metrics["policy_version_min"] == t.metrics["policy_version_max"] == version
    assert [t.response_ids for t in before] != [t.response_ids for t in after]  # the new weights sample


def _perturbed(config):
    from horizonrl.models import load_base

    model = load_base(config.model).base
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def test_a_dying_env_worker_costs_only_its_episodes(cluster):
    config = load_config(
        "configs/calc.yaml", [*TINY, *RAY, "agent.max_turns=6", "sampling.max_new_tokens=24"]
    )
    runtime = build_runtime(config)
    try:
        pool = runtime.backend.pool
        victim = pool.workers[0]
        tasks = make_tasks(config.env, "train", 8, 0)

        async def go():
            rollout = asyncio.ensure_future(run_rollouts(runtime.agent, pool.factory, tasks, 2, 16))
            while pool.load.get(victim, 0) == 0:
                await asyncio.sleep(0.01)
            ray.kill(victim)
            return await rollout

        trajs = list(asyncio.run(go()))
        assert len(trajs) == 16
        failed = [t for t in trajs if t.finish == "error"]
        assert failed and len(failed) < 16
        assert all("env worker" in t.error and "died" in t.error for t in failed)
        assert pool.lost_workers == 1 and len(pool.workers) == 2  # replaced
        again = asyncio.run(run_rollouts(runtime.agent, pool.factory, tasks[:2], 2, 4))
        assert all(t.finish != "error" for t in again)
    finally:
        runtime.close()


def test_a_dying_engine_replica_is_retried_on_another(cluster):
    config = load_config(
        "configs/calc.yaml", [*TINY, *RAY, "runtime.engine_replicas=2", "sampling.max_new_tokens=48"]
    )
    runtime = build_runtime(config)
    try:
        router = runtime.engine
        tasks = make_tasks(config.env, "train", 8, 0)

        async def go():
            rollout = asyncio.ensure_future(
                run_rollouts(runtime.agent, runtime.backend.env_factory(), tasks, 2, 16)
            )
            while not any(router.in_flight.values()):
                await asyncio.sleep(0.005)
            busy = max(router.in_flight, key=router.in_flight.get)
            ray.kill(busy)
            return await rollout

        trajs = list(asyncio.run(go()))
        assert len(trajs) == 16 and all(t.finish != "error" for t in trajs)
        assert router.retries >= 1 and router.lost_replicas == 1 and len(router.replicas) == 2
    finally:
        runtime.close()


def test_trainer_ranks_that_want_gpus_the_cluster_lacks_are_named(cluster):
    config = load_config(
        "configs/calc.yaml",
        [*TINY, *RAY, "runtime.trainer_ranks=2", "runtime.trainer_gpus=1", "runtime.placement_timeout_s=3"],
    )
    with pytest.raises(HorizonError, match=r"GPU: 2 wanted, 0 in the cluster.*trainer_ranks=2"):
        worker_backend(config)  # a RayBackend (runtime.backend=ray)


def test_a_cluster_without_the_resources_is_an_error_naming_them(cluster):
    config = load_config(
        "configs/calc.yaml",
        [*TINY, *RAY, "runtime.env_worker_resources={sandbox_node: 1}", "runtime.placement_timeout_s=3"],
    )
    start = time.monotonic()
    with pytest.raises(HorizonError, match="sandbox_node: 2 wanted, 0 in the cluster"):
        worker_backend(config)  # a RayBackend (runtime.backend=ray)
    assert time.monotonic() - start < 30


def test_an_address_that_does_not_answer_is_one_line_and_quick():
    if ray.is_initialized():
        ray.shutdown()
    config = load_config(
        "configs/calc.yaml", [*TINY, *RAY, "runtime.address=127.0.0.1:9", "runtime.connect_timeout_s=2"]
    )
    start = time.monotonic()
    with pytest.raises(ConfigError, match="does not answer"):
        worker_backend(config)  # a RayBackend (runtime.backend=ray)
    assert time.monotonic() - start < 10


def test_without_ray_installed_the_error_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    from horizonrl.runtime.ray_backend import import_ray

    with pytest.raises(ConfigError, match=r"pip install 'horizonrl\[ray\]'"):
        import_ray()


def _train_on_ray(tmp_path, name, extra=(), recipe="configs/calc.yaml"):
    from horizonrl.train.run import TrainingRun

    config = load_config(
        recipe,
        [
            *TINY,
            *RAY,
            "sampling.temperature=1.0",
            "sft.num_demos=4",
            "train.steps=2",
            "train.tasks_per_step=2",
            "train.group_size=2",
            "eval.num_tasks=4",
            f"output_dir={tmp_path}",
            f"name={name}",
            *extra,
        ],
    )
    summary = TrainingRun(config).run()
    assert summary["finished"] and summary["sft"]
    run = tmp_path / name
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return config, run, [m for m in metrics if m["step"] > 0]


def test_a_training_run_on_ray_trains_and_syncs_the_replicas(cluster, tmp_path):
    _, run, steps = _train_on_ray(tmp_path, "onray")
    assert [m["engine/batches"] > 0 for m in steps] == [True, True]
    trajs = [
        json.loads(line) for line in (run / "trajectories" / "step_000002.jsonl").read_text().splitlines()
    ]
    versions = {t["metrics"]["policy_version_min"] for t in trajs}
    assert len(versions) == 1 and versions.pop() >= 1  # sampled from the synced weights, one version
    assert (run / "policy").is_dir()


def _parity_recipe(tmp_path):
    """The demo recipe on the tests' parity game (its rewards follow the sampled text's length, so a
    tiny random model's groups carry signal); the env workers import it from the tests directory."""
    recipe = yaml.safe_load(Path("configs/calc.yaml").read_text(encoding="utf-8"))
    recipe["env"] = {"name": "toy_envs:ParityEnv", "options": {}}
    path = tmp_path / "parity.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def _update_in_one_process(config, run, step):
    """The update of ``step`` recomputed here, in one process, from the run's own start: the base
    with the run's SFT adapter merged, the RL policy of its previous checkpoint, the step's records."""
    from horizonrl.models import load_base
    from horizonrl.policy import apply_adapter
    from horizonrl.seeds import derive_seed
    from horizonrl.train.checkpoint import load_training_state
    from horizonrl.train.update import train_step
    from horizonrl.trainable import build_policy
    from horizonrl.types import read_trajectories

    loaded = load_base(config.model)
    base = apply_adapter(loaded.base, run / "sft_adapter").merge_and_unload()
    tc = config.train
    built = build_policy(
        base, config.model, optim=tc, critic=tc.critic, init_seed=derive_seed(config.seed, "policy_init")
    )
    policy, optimizer, scheduler = built.model, built.optimizer, built.scheduler
    load_training_state(run / "checkpoints" / f"step_{step - 1:06d}", optimizer, policy, built.modules)
    records = sorted(read_trajectories(run / "trajectories" / f"step_{step:06d}.jsonl"), key=lambda t: t.id)
    return train_step(
        policy,
        optimizer,
        scheduler,
        records,
        config.train,
        loaded.tokenizer.pad_token_id,
        config.sampling.temperature,
        seed=derive_seed(config.seed, "update", step),
    )


def test_trainer_ranks_train_as_one_process_does(cluster, tmp_path):
    """The update in two data-parallel trainer ranks (gloo) against the same update in one process:
    the ranks start from the run's SFT start (they replay its merge; a differing rank is refused by
    fingerprint), and their summed gradients give one process's loss and gradient norm; the weights
    and rank 0's optimizer come back for the engines and the checkpoint. Float32 and one optimizer
    step per batch, so loss and gradient are functions of the same weights on both sides."""
    config, ranked, steps = _train_on_ray(
        tmp_path,
        "ranked",
        [
            "train.autocast=none",
            "train.mini_batches=1",
            "train.steps=1",
            "runtime.trainer_ranks=2",
            "runtime.trainer_cpus=0.5",
        ],
        recipe=_parity_recipe(tmp_path),
    )
    assert [m.get("trainer_ranks") for m in steps] == [2.0]
    alone = _update_in_one_process(config, ranked, 1)
    assert steps[0]["trained_trajectories"] == alone["trained_trajectories"] > 0
    for key in ("loss", "grad_norm"):
        assert steps[0][key] == pytest.approx(alone[key], rel=1e-4, abs=1e-6), key
    # the ranks' weights came back: the checkpoint holds a trained adapter and rank 0's optimizer
    from safetensors.torch import load_file

    from horizonrl.train.checkpoint import OPTIMIZER_FILE, list_checkpoints

    last = list_checkpoints(ranked)[-1]
    assert last.name == "step_000001"
    saved = torch.load(last / OPTIMIZER_FILE, weights_only=False)["state"]
    assert {int(v["step"]) for v in saved.values()} == {1}  # the driver's own optimizer never stepped
    rl = load_file(ranked / "policy" / "stages" / "01_rl" / "adapter_model.safetensors")
    assert any(t.abs().sum() > 0 for k, t in rl.items() if "lora_B" in k)  # LoRA B starts at zero


def _ray_node(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    """One ``ray start --block`` node in its own process group, so that the test stops exactly the
    processes it started (``ray stop`` would stop every Ray cluster on the machine). Its output goes
    to ``log`` (a pipe nobody reads would fill and stall the node)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", *args, "--disable-usage-stats", "--block"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop_node(node: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.wait(wait)
            break


def _wait_for_port(port: int, node: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if node.poll() is not None:
            raise AssertionError(f"the head node exited: {log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.5)
    raise AssertionError(f"the head node did not listen on {port} within {timeout_s}s")


# last in the module: it stops the module's cluster to start one of its own
def test_a_second_node_hosts_the_sandbox_workers(tmp_path):
    """`ray start --head` plus a worker node with its own resources (two raylets on this machine);
    the env workers ask for that node's resource and run there. The nodes use this process's token
    authentication mode (``ray.init()`` turned it on if the module's cluster ran first): a head node
    turns it on by itself when ``~/.ray/auth_token`` exists, a joining worker node does not."""
    if ray.is_initialized():
        ray.shutdown()
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    port = free_port()
    head_log = tmp_path / "head.log"
    head = _ray_node(
        "--head",
        f"--port={port}",
        f"--ray-client-server-port={free_port()}",
        "--num-cpus=2",
        "--include-dashboard=false",
        env=env,
        log=head_log,
    )
    nodes: list[subprocess.Popen] = [head]
    try:
        _wait_for_port(port, head, head_log)
        worker = ("--num-cpus=2", '--resources={"sandbox_node": 4}')
        nodes.append(_ray_node(f"--address=127.0.0.1:{port}", *worker, env=env, log=tmp_path / "worker.log"))
        config = load_config(
            "configs/calc.yaml",
            [
                *TINY,
                *RAY,
                f"runtime.address=127.0.0.1:{port}",
                "runtime.env_worker_resources={sandbox_node: 1}",
            ],
        )
        runtime, trajs = _rollout(config, n_tasks=4, samples=2)
        where = runtime.backend.where()
        alive = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
        runtime.close()
        ray.shutdown()
        sandbox_nodes = {k for k, n in alive.items() if n["Resources"].get("sandbox_node")}
        assert len(alive) == 2 and len(sandbox_nodes) == 1
        assert {w["node_id"] for w in where["env_workers"]} == sandbox_nodes
        assert len(trajs) == 8 and all(t.finish != "error" for t in trajs)
        # with that cluster still up, a run without runtime.address starts its own, not joins it
        own, _ = _rollout(load_config("configs/calc.yaml", [*TINY, *RAY]), n_tasks=1, samples=1)
        try:
            assert own.backend._started_cluster
            assert not {n["NodeID"] for n in ray.nodes()} & set(alive)
        finally:
            own.close()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for node in reversed(nodes):
            _stop_node(node)


def test_a_cluster_started_for_the_run_imports_what_the_driver_imports(tmp_path):
    """No cluster running: the backend starts one whose workers see the driver's import path, so an
    env given as module:Class from the driver's directories (here the tests' ``toy_envs``) loads."""
    if ray.is_initialized():
        ray.shutdown()
    config = load_config(_parity_recipe(tmp_path), [*TINY, *RAY])
    runtime, trajs = _rollout(config, n_tasks=2, samples=2)
    try:
        assert runtime.backend._started_cluster
        assert len(trajs) == 4 and all(t.finish != "error" for t in trajs)
    finally:
        runtime.close()
    assert not ray.is_initialized()
