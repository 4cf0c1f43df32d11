"""radixlm vs llama.cpp (llama-cpp-python) on the same GGUF, same token ids, alternating
rounds: single-stream decode tok/s, prefill tok/s and TTFT, decode after the
``--prefill-tokens`` prompt (``long_decode_tok_s``: every token attends to all of it),
decode of ``--streams`` streams at once (radixlm's continuous batching against llama.cpp's
parallel sequences, as llama-server's slots run them); per-round ratios and medians; then
each system's load time and peak memory, with their ratios.

    make bench-llamacpp        # builds llama-cpp-python into .venv-llamacpp once (~10 min)
    .venv/bin/python benchmarks/bench_vs_llamacpp.py [--model PATH.gguf] [--rounds 3]
        [--llama-python PY] [--systems radixlm,llama_cpp] [--out FILE]

``--model``: any GGUF (default: the embedded SmolLM2-135M-Instruct). Each system runs in a
worker process of its own (llama.cpp under its own interpreter, ``--llama-python``, default
``.venv-llamacpp/bin/python``, else this one; radixlm under this one), and the parent
alternates them round by round so the VM's slow phases hit both alike. Both use every core
of the host (llama.cpp ``n_threads`` = cores, torch's default) and a ``--ctx``-token KV
cache (radixlm's pool sized to it too).

Load and memory, per worker: ``start_to_ready_s`` (process start to its ready line: the
interpreter, imports and the model), ``construct_s`` (``Llama(...)`` / ``Engine(...)``
alone), ``rss_after_load_gib`` and ``peak_rss_gib`` (``/proc/PID/status`` VmRSS after load,
VmHWM at the end: resident pages, a memory-mapped file's included); radixlm's also
``cache_written_gib`` (what its load added to its cache folder, e.g. a converted copy, as
the folder's growth, walked by the parent before the start and after ready: another
process writing there meanwhile counts too; load with
``--prime-radixlm-cache`` to time a load after the cache is filled). The GGUF is read
once before either starts, so both load from the page cache. ``--starts N`` adds N more
starts of each system after the rounds, alternating, each start to ready printed with the
per-pair ratios (one start swings up to 2x on the VMs). radixlm's modules are compiled to
bytecode before the first start (``llamacpp_common.compile_bytecode``: as pip leaves an
installed package, llama-cpp-python among them).

Memory: a system whose estimate (file size + its KV cache + a runtime allowance) exceeds
MemAvailable less ``--mem-reserve-gib`` is not started and is reported as not fitting;
systems that fit alone but not together run one after the other (``alternated``: false). A
guard polls MemAvailable while workers run and stops them (reported, exit status 3) before
it falls under the reserve, so a run never ends in the kernel's OOM killer.
Before each round the parent reads the host's memory rate (``memory_read_gbs``: torch
summing 512 MiB on ``--threads`` threads), printed per round: a GGUF's one-token step
streams its weights at that rate, which moves ~1.6x within minutes on the VMs.
Prints the host first; JSON then a table at the end.
"""

from __future__ import annotations

# radixlm before torch (it bounds OpenMP's spin-wait, which libgomp reads once, when torch
# loads it)
try:
    import radixlm  # noqa: F401  # isort: skip
except ImportError:  # the llama.cpp worker runs in llama.cpp's own venv
    pass

import argparse
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_common import (  # noqa: E402
    add_extra_bufts_arg,
    compile_bytecode,
    extra_bufts_on,
    mem_available,
    memory_read_gbs,
    status_kib,
)

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30
WORDS = ("the of and to in is was for on that with as by at from his her an were are which "
         "this be or had not but what all when there can who been one more time city river "
         "water music history science garden market winter summer story people world").split()
STREAM_PROMPT = 16  # tokens of each stream's prompt (--streams)
# resident memory beyond the weights and the KV cache: llama.cpp's compute buffers and
# logits; radixlm's interpreter with torch, its step buffers and logits
RUNTIME_ALLOWANCE = {"llama_cpp": 0.5 * GIB, "radixlm": 1.5 * GIB}


# ---------------------------------------------------------------- workers
def llama_worker(gguf: str, threads: int, extra_bufts: bool, ctx: int) -> None:
    """Reads one JSON job a line ({"prompt": ids, "new": n}), answers timings a line.
    ``extra_bufts`` False: plain weight buffers (``llamacpp_common.use_plain_buffers``)."""
    import llama_cpp
    from llamacpp_common import announce_ready, llama_streams, use_plain_buffers

    if not extra_bufts:
        use_plain_buffers(llama_cpp)
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=ctx, n_threads=threads,
                          n_threads_batch=threads, n_batch=512, verbose=False)
    announce_ready(llama_cpp, construct_s=time.perf_counter() - t0)
    for line in sys.stdin:
        job = json.loads(line)
        llm.reset()
        if "prompts" in job:
            print(json.dumps(llama_streams(llm, job["prompts"], job["new"], threads)),
                  flush=True)
            continue
        t0 = time.perf_counter()
        first = None
        n = 0
        for _ in llm.generate(job["prompt"], top_k=1, top_p=1.0, temp=0.0, reset=True):
            n += 1
            if first is None:
                first = time.perf_counter() - t0
            if n >= job["new"]:
                break
        total = time.perf_counter() - t0
        print(json.dumps({"ttft": first, "total": total, "tokens": n}), flush=True)


def radixlm_worker(model: str, mode: str, speculative: str | None, ctx: int) -> None:
    """radixlm's twin of ``llama_worker``; also answers {"encode": text} with token ids and
    {"stats": true} with the engine's speculation counters."""
    from radixlm.runtime.engine import Engine

    t0 = time.perf_counter()
    engine = Engine(model, log_level="warning", native_activations=mode,
                    speculative_algorithm=speculative, context_length=ctx,
                    max_total_tokens=ctx)
    construct_s = time.perf_counter() - t0
    print(json.dumps({"ready": "radixlm", "construct_s": construct_s,
                      "precision": engine.runner.precision}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        if "encode" in job:
            out = {"ids": engine.tokenizer.encode(job["encode"], add_special_tokens=False)}
        elif "stats" in job:
            stats = engine.get_stats()
            out = {k: stats.get(k, 0) for k in ("spec_draft_tokens_total",
                                                "spec_accepted_tokens_total")}
        elif "prompts" in job:
            out = run_radixlm_streams(engine, job["prompts"], job["new"])
        else:
            out = run_radixlm(engine, job["prompt"], job["new"])
        print(json.dumps(out), flush=True)
    engine.shutdown()


def _tree_bytes(folder: Path) -> int:
    """Bytes under ``folder``, less make_gguf's models (their default folder lies inside)."""
    from make_gguf import DEFAULT_OUT

    skip = DEFAULT_OUT.expanduser().resolve()
    total = 0
    for base, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if Path(base, d).resolve() != skip]
        for name in files:
            try:
                total += os.path.getsize(os.path.join(base, name))
            except OSError:
                pass
    return total


def run_radixlm(engine, prompt: list[int], new: int) -> dict:
    t0 = time.perf_counter()
    out = engine.generate(input_ids=prompt, sampling_params={
        "max_new_tokens": new, "temperature": 0, "ignore_eos": True})
    total = time.perf_counter() - t0
    engine.flush_cache()  # no prefix reuse between runs: llama.cpp is reset too
    return {"ttft": out["meta_info"]["ttft"], "total": total,
            "tokens": out["meta_info"]["completion_tokens"]}


def run_radixlm_streams(engine, prompts: list[list[int]], new: int) -> dict:
    """``llama_streams``' job on radixlm: the prompts as one ``generate`` call (continuous
    batching); ``ttft`` the last request's first token."""
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params={
        "max_new_tokens": new, "temperature": 0, "ignore_eos": True})
    total = time.perf_counter() - t0
    engine.flush_cache()
    return {"ttft": max(o["meta_info"]["ttft"] for o in outs), "total": total,
            "tokens": sum(o["meta_info"]["completion_tokens"] for o in outs)}


class WorkerGone(RuntimeError):
    """A worker ended before answering (stopped by the memory guard, or crashed)."""


class Worker:
    """One system in its own process: JSON jobs in a line at a time, answers out; its load
    time and resident memory read from outside."""

    def __init__(self, name: str, argv: list[str], guard: MemoryGuard) -> None:
        self.name, self.guard = name, guard
        # radixlm's cache folder walked here, before the start and after ready (not part of
        # the worker's start to ready)
        cache = None
        if name.startswith("radixlm"):
            from radixlm import envs

            cache = envs.cache_dir()
            cache_before = _tree_bytes(cache)
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        guard.watch(self)
        self.ready = self._read()
        self.load = {"start_to_ready_s": time.perf_counter() - t0,
                     "construct_s": self.ready["construct_s"],
                     "rss_after_load_gib": status_kib(self.proc.pid, "VmRSS") / 2**20}
        if cache is not None:
            self.load["cache_written_gib"] = (_tree_bytes(cache) - cache_before) / GIB

    def ask(self, job: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # _read says why
        return self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            raise WorkerGone(self.guard.tripped or f"{self.name} worker exited ({rc})")
        return json.loads(line)

    def close(self) -> dict:
        """Ends the worker; returns its load figures with ``peak_rss_gib``."""
        self.load["peak_rss_gib"] = status_kib(self.proc.pid, "VmHWM") / 2**20
        self.proc.stdin.close()
        self.proc.wait(timeout=120)
        self.guard.unwatch(self)
        return self.load


class MemoryGuard(threading.Thread):
    """Stops every watched worker when MemAvailable falls under ``reserve`` bytes, and says
    so in ``tripped`` (with each worker's resident set at that moment)."""

    def __init__(self, reserve: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.reserve, self.interval = reserve, interval
        self.workers: list[Worker] = []
        self.tripped: str | None = None
        self.lock = threading.Lock()

    def watch(self, worker: Worker) -> None:
        with self.lock:
            self.workers.append(worker)
            if self.tripped is not None:
                worker.proc.kill()

    def unwatch(self, worker: Worker) -> None:
        with self.lock:
            self.workers.remove(worker)

    def run(self) -> None:
        while True:
            avail = mem_available()
            if avail < self.reserve:
                with self.lock:
                    rss = {w.name: status_kib(w.proc.pid, "VmRSS") / 2**20 for w in self.workers}
                    self.tripped = (f"memory guard: MemAvailable {avail / GIB:.2f} GiB fell under "
                                    f"the {self.reserve / GIB:.1f} GiB reserve; stopped "
                                    + ", ".join(f"{n} (RSS {r:.2f} GiB)" for n, r in rss.items()))
                    for w in self.workers:
                        w.proc.kill()
                return
            time.sleep(self.interval)


# ---------------------------------------------------------------- memory estimates
def kv_bytes(gguf: str, ctx: int) -> int:
    """An f16 K and V cache of ``ctx`` tokens for the GGUF's shape."""
    st = os.stat(gguf)
    return _kv_bytes_per_token(str(Path(gguf).resolve()), st.st_mtime_ns, st.st_size) * ctx


@functools.lru_cache(maxsize=16)
def _kv_bytes_per_token(gguf: str, mtime_ns: int, size: int) -> int:
    """An f16 K and V token's bytes, read once per file version: gguf's reader parses the
    whole vocabulary, seconds a call, and ``plan`` asks once per system."""
    import gguf as gguf_py

    reader = gguf_py.GGUFReader(gguf)
    arch = reader.fields["general.architecture"].contents()

    def field(key: str) -> int:
        return int(reader.fields[f"{arch}.{key}"].contents())

    head_dim = field("embedding_length") // field("attention.head_count")
    return 2 * 2 * field("block_count") * field("attention.head_count_kv") * head_dim


def memory_need(gguf: str, ctx: int, system: str) -> int:
    """What a system is estimated to hold resident: the file (memory-mapped or loaded in its
    block format), its KV cache and ``RUNTIME_ALLOWANCE``."""
    kind = "llama_cpp" if system == "llama_cpp" else "radixlm"
    return os.path.getsize(gguf) + kv_bytes(gguf, ctx) + int(RUNTIME_ALLOWANCE[kind])


def plan(gguf: str, ctx: int, systems: list[str], reserve: int) -> tuple[list[list[str]], dict]:
    """Groups of systems to run together (one group: alternated) and the ones that do not
    fit, each with its estimate and what is available."""
    avail = mem_available() - reserve
    need = {s: memory_need(gguf, ctx, s) for s in systems}
    unfit = {s: {"need_gib": need[s] / GIB, "available_gib": avail / GIB}
             for s in systems if need[s] > avail}
    fit = [s for s in systems if s not in unfit]
    groups = [fit] if sum(need[s] for s in fit) <= avail else [[s] for s in fit]
    return [g for g in groups if g], unfit


# ---------------------------------------------------------------- the run
def metrics(run_short: dict, run_long: dict, long_len: int, run_streams: dict | None = None,
            streams: int = 0) -> dict:
    out = {
        "single_decode_tok_s": (run_short["tokens"] - 1) / (run_short["total"]
                                                             - run_short["ttft"]),
        "ttft_s": run_short["ttft"],
        "prefill_tok_s": long_len / run_long["ttft"],
        "prefill_ttft_s": run_long["ttft"],
        # decode after the long prompt: every token attends to all of it
        "long_decode_tok_s": (run_long["tokens"] - 1) / (run_long["total"] - run_long["ttft"]),
    }
    if run_streams:  # the tokens after every stream's first, over the time after it
        out[f"streams{streams}_decode_tok_s"] = ((run_streams["tokens"] - streams)
                                                 / (run_streams["total"] - run_streams["ttft"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--radixlm-worker", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None,
                    help="a .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--systems", default="radixlm,llama_cpp",
                    help="which to run: radixlm, llama_cpp or both (comma list)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prefill-tokens", type=int, default=1800)
    ap.add_argument("--ctx", type=int, default=4096, help="KV cache tokens of both systems")
    ap.add_argument("--streams", type=int, default=8,
                    help="also decode this many streams at once (distinct prompts of "
                         f"{STREAM_PROMPT} tokens, --new-tokens each; llama.cpp as "
                         "llama-server's parallel slots run them): streamsN_decode_tok_s, "
                         "the tokens after every stream's first over the time after it; "
                         "0: skip")
    ap.add_argument("--llama-python", default=None,
                    help="interpreter with llama_cpp (default .venv-llamacpp/bin/python)")
    add_extra_bufts_arg(ap)
    ap.add_argument("--native-activations", default="auto",
                    help="radixlm's native_activations (auto | fp32 | int8 | bf16), or a "
                         "comma list (e.g. fp32,int8): one engine each, alternating with "
                         "llama.cpp round by round; int8 is llama.cpp's own per-block "
                         "rounding of activations")
    ap.add_argument("--speculative-algorithm", default=None,
                    help="radixlm's speculative_algorithm (default: the engine's own, NGRAM "
                         "where native steps run; none: off). This prompt's greedy text "
                         "repeats itself, so n-gram drafts are nearly always accepted here")
    ap.add_argument("--prime-radixlm-cache", action="store_true",
                    help="load radixlm once before the measured load (whatever its load "
                         "writes to its cache, e.g. a converted copy, is then in place)")
    ap.add_argument("--mem-reserve-gib", type=float, default=1.5,
                    help="MemAvailable kept free: estimates are checked against it and the "
                         "guard stops the workers before it is reached")
    ap.add_argument("--starts", type=int, default=0,
                    help="after the rounds, start each system this many more times, "
                         "alternating, and report each start to ready (one start swings "
                         "up to 2x on the VMs)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.llama_extra_bufts = extra_bufts_on(args.llama_extra_bufts)
    if args.worker:
        llama_worker(args.worker, args.threads, args.llama_extra_bufts, args.ctx)
        return
    if args.radixlm_worker:
        radixlm_worker(args.radixlm_worker, args.mode, args.speculative_algorithm, args.ctx)
        return
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not 0 <= args.streams * STREAM_PROMPT <= 4 * args.prefill_tokens:
        ap.error(f"--streams {args.streams}: 0 to {4 * args.prefill_tokens // STREAM_PROMPT} "
                 f"with --prefill-tokens {args.prefill_tokens} (the streams' prompts are "
                 f"{STREAM_PROMPT} distinct tokens each of the prompt's text)")
    if args.prefill_tokens + args.new_tokens > args.ctx:  # (the long prompt decodes too)
        ap.error(f"--prefill-tokens {args.prefill_tokens} + --new-tokens {args.new_tokens} "
                 f"exceed --ctx {args.ctx}")
    if not set(args.systems.split(",")) <= {"radixlm", "llama_cpp"}:
        ap.error(f"--systems takes radixlm and/or llama_cpp, not {args.systems!r}")
    if args.model is not None and not (Path(args.model).is_file()
                                       and args.model.endswith(".gguf")):
        ap.error(f"--model {args.model!r} is not a .gguf file (llama.cpp runs GGUFs only)")
    sys.exit(run(args))


def run(args) -> int:
    from radixlm.native.build import host_info, host_line
    from radixlm.runtime.weights import DEFAULT_MODEL, alias_paths

    host = host_info()
    print(host_line(host), flush=True)
    print(compile_bytecode(ROOT / "radixlm"), flush=True)
    gguf = str(Path(args.model).resolve()) if args.model else str(alias_paths()[DEFAULT_MODEL])
    modes = args.native_activations.split(",")
    wanted = args.systems.split(",")
    # "radixlm" for one mode (the JSON of earlier runs), else one per mode
    names = ([("radixlm" if len(modes) == 1 else f"radixlm_{m}") for m in modes]
             if "radixlm" in wanted else [])
    systems = names + (["llama_cpp"] if "llama_cpp" in wanted else [])
    t0 = time.perf_counter()
    size = _read_through(gguf)
    print(f"model {gguf}: {size / GIB:.2f} GiB, read into the page cache in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    reserve = int(args.mem_reserve_gib * GIB)
    groups, unfit = plan(gguf, args.ctx, systems, reserve)
    for name, why in unfit.items():
        print(f"{name}: does not fit: needs about {why['need_gib']:.1f} GiB, "
              f"{why['available_gib']:.1f} GiB available above the reserve", flush=True)
    guard = MemoryGuard(reserve)
    guard.start()
    state = {"gguf": gguf, "host": host, "systems": systems, "does_not_fit": unfit,
             "alternated": len(groups) <= 1, "rounds": [{} for _ in range(args.rounds)],
             "load": {}, "precision": {}, "status": "ok"}
    try:
        if args.prime_radixlm_cache and names:
            primer = Worker("radixlm_prime", _argv(args, "radixlm", gguf, modes[0]), guard)
            state["first_load"] = primer.close()
        for group in groups:
            run_group(args, gguf, group, dict(zip(names, modes)), guard, state)
        if args.starts:
            state["starts"] = time_starts(args, gguf, [n for g in groups for n in g],
                                          dict(zip(names, modes)), guard)
    except WorkerGone as e:
        state["status"] = str(e)
        print(f"stopped: {e}", flush=True)
    report(args, state)
    return 0 if state["status"] == "ok" and not unfit else 3


def time_starts(args, gguf: str, systems: list[str], modes: dict[str, str],
                guard: MemoryGuard) -> dict[str, list[float]]:
    """``args.starts`` starts of each system, alternating: start to ready, seconds."""
    out: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(args.starts):
        for name in systems:
            worker = Worker(name, _argv(args, name, gguf, modes.get(name, "auto")), guard)
            out[name].append(worker.close()["start_to_ready_s"])
    return out


def _read_through(path: str) -> int:
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            size += len(chunk)
    return size


def _argv(args, system: str, gguf: str, mode: str = "auto") -> list[str]:
    common = ["--threads", str(args.threads), "--ctx", str(args.ctx)]
    if system == "llama_cpp":
        python = args.llama_python or str(ROOT / ".venv-llamacpp" / "bin" / "python")
        if not Path(python).exists():
            python = sys.executable
        return ([python, __file__, "--worker", gguf, *common]
                + ["--llama-extra-bufts", "on" if args.llama_extra_bufts else "off"])
    return ([sys.executable, __file__, "--radixlm-worker", gguf, "--mode", mode, *common]
            + (["--speculative-algorithm", args.speculative_algorithm]
               if args.speculative_algorithm else []))


def run_group(args, gguf: str, group: list[str], modes: dict[str, str], guard: MemoryGuard,
              state: dict) -> None:
    """Starts ``group``'s workers one after the other, runs the rounds alternating them,
    and closes them, filling ``state``."""
    workers: dict[str, Worker] = {}
    try:
        for name in group:
            workers[name] = Worker(name, _argv(args, name, gguf, modes.get(name, "auto")),
                                   guard)
            w = workers[name]
            if name == "llama_cpp":
                state["llama_cpp_version"] = w.ready["ready"]
                state["llama_cpp_features"] = w.ready.get("features", "")
            else:
                state["precision"][name] = w.ready["precision"]
            print(f"{name}: ready in {w.load['start_to_ready_s']:.1f} s (construction "
                  f"{w.load['construct_s']:.1f} s), RSS {w.load['rss_after_load_gib']:.2f} GiB"
                  + (f"; radixlm wrote {w.load['cache_written_gib']:.2f} GiB to its cache"
                     if w.load.get("cache_written_gib") else ""), flush=True)
        if "ids" not in state:
            state["ids"] = _prompt_ids(args, gguf, workers)
        ids = state["ids"]
        short, long = ids[:64], ids[:args.prefill_tokens]
        for w in workers.values():  # warm-up all
            w.ask({"prompt": short, "new": 8})
        # the streams' prompts: distinct, STREAM_PROMPT tokens each (no shared prefix)
        prompts = [ids[STREAM_PROMPT * i:STREAM_PROMPT * (i + 1)] for i in range(args.streams)]
        for r in state["rounds"]:
            r["memory_read_gbs"] = memory_read_gbs(args.threads)
            for name, w in workers.items():
                r[name] = metrics(w.ask({"prompt": short, "new": args.new_tokens}),
                                  w.ask({"prompt": long, "new": args.new_tokens}), len(long),
                                  prompts and w.ask({"prompts": prompts,
                                                     "new": args.new_tokens}), args.streams)
            print(json.dumps({n: r[n] for n in [*group, "memory_read_gbs"]}), flush=True)
        for name, w in workers.items():
            if name != "llama_cpp":
                state["precision"][name]["speculation"] = w.ask({"stats": True})
    finally:
        for name, w in workers.items():
            if w.proc.poll() is None:
                state["load"][name] = w.close()


def _prompt_ids(args, gguf: str, workers: dict[str, Worker]) -> list[int]:
    """Random words tokenized by radixlm (a radixlm worker of the group; transformers' reading
    of the file's tokenizer when llama.cpp runs alone)."""
    rng = random.Random(0)
    text = " ".join(rng.choice(WORDS) for _ in range(4 * args.prefill_tokens))
    radix = next((w for n, w in workers.items() if n != "llama_cpp"), None)
    if radix is not None:
        return radix.ask({"encode": text})["ids"]
    from transformers import AutoTokenizer  # the file's tokenizer alone, no weights

    tok = AutoTokenizer.from_pretrained(str(Path(gguf).parent), gguf_file=Path(gguf).name)
    return tok.encode(text, add_special_tokens=False)


def _ratio(key: str, ours: float, theirs: float) -> float:
    """> 1: radixlm better (rates: ours / theirs; times and sizes: theirs / ours)."""
    if key.endswith("tok_s"):
        return ours / theirs
    return theirs / ours if ours else float("nan")


def report(args, state: dict) -> None:
    from radixlm.native.build import host_line

    rounds = [r for r in state.pop("rounds") if r]
    names = [n for n in state["systems"] if n != "llama_cpp" and n in state["load"]]
    ran = [n for n in state["systems"] if all(n in r for r in rounds)] if rounds else []
    keys = list(rounds[0][ran[0]]) if ran else []
    results = {**{k: v for k, v in state.items() if k != "ids"},
               "threads": args.threads, "ctx": args.ctx,
               "llama_extra_bufts": args.llama_extra_bufts,
               "speculative_algorithm": args.speculative_algorithm, "rounds": rounds,
               **{n: {k: statistics.median(r[n][k] for r in rounds) for k in keys}
                  for n in ran}}
    both = "llama_cpp" in ran
    for name in names if both else []:
        suffix = name[len("radixlm"):]
        if name in ran:
            per_round = [{k: _ratio(k, r[name][k], r["llama_cpp"][k]) for k in keys}
                         for r in rounds]
            results[f"ratio_per_round{suffix}"] = per_round
            results[f"ratio_median{suffix}"] = {k: statistics.median(p[k] for p in per_round)
                                                for k in keys}
        if "llama_cpp" in state["load"]:
            ours, theirs = state["load"][name], state["load"]["llama_cpp"]
            results[f"load_ratio{suffix}"] = {k: _ratio(k, ours[k], theirs[k]) for k in theirs}
    print(json.dumps(results, indent=2))
    print(f"\n{host_line(state['host'])}; {args.threads} threads; model {state['gguf']}")
    if "llama_cpp_version" in state:
        print(f"llama-cpp-python {state['llama_cpp_version']}, built for: "
              f"{state['llama_cpp_features']}; extra buffer types (repacked weights) "
              + ("on" if args.llama_extra_bufts else "off"))
    if not state["alternated"]:
        print("systems ran one after the other (they do not fit in memory together)")
    for name, why in state["does_not_fit"].items():
        print(f"{name}: does not fit (needs about {why['need_gib']:.1f} GiB, "
              f"{why['available_gib']:.1f} GiB available)")
    if state["status"] != "ok":
        print(f"stopped: {state['status']}")
    if "first_load" in state:
        first = state["first_load"]
        print(f"radixlm's priming load: ready in {first['start_to_ready_s']:.1f} s "
              f"(construction {first['construct_s']:.1f} s), wrote "
              f"{first.get('cache_written_gib', 0):.2f} GiB to its cache, peak RSS "
              f"{first['peak_rss_gib']:.2f} GiB")
    for name in names or ran:
        _table(results, state, name, keys, both)
    if rounds:
        print("host memory read GB/s before each round (decode is bound by it): "
              + " ".join(f"{r['memory_read_gbs']:.1f}" for r in rounds))
    for name, times in state.get("starts", {}).items():
        ratios = ("; radixlm / llama.cpp per pair " + " ".join(
            f"{a / b:.2f}" for a, b in zip(times, state["starts"]["llama_cpp"], strict=True))
            if name != "llama_cpp" and "llama_cpp" in state["starts"] else "")
        print(f"{name} starts to ready, s: " + " ".join(f"{t:.2f}" for t in times)
              + f" (median {statistics.median(times):.2f}){ratios}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


def _table(results: dict, state: dict, name: str, keys: list[str], both: bool) -> None:
    suffix = name[len("radixlm"):] if name != "llama_cpp" else ""
    prec = state["precision"].get(name)
    if prec:
        spec = prec.get("speculation", {})
        print(f"{name}: weights {prec['weights']}; activations {prec['activations']}; draft "
              f"tokens accepted / drafted {spec.get('spec_accepted_tokens_total', '-')} / "
              f"{spec.get('spec_draft_tokens_total', '-')}")
    other = "llama_cpp" if both and name != "llama_cpp" else None
    print(f"{'metric':<22}{name:>14}{'llama.cpp' if other else '':>11}"
          f"{'ratio' if other else '':>8}  {'per round (>1: radixlm)' if other else ''}")

    def row(key: str, ours, theirs, ratio, per: str = "") -> None:
        print(f"{key:<22}{ours:>14.3f}" + (f"{theirs:>11.3f}{ratio:>8.2f}  {per}" if other
                                            else ""))

    for k in keys if name in results else []:
        per = " ".join(f"{p[k]:.2f}" for p in results.get(f"ratio_per_round{suffix}", []))
        row(k, results[name][k], results[other][k] if other else 0,
            results.get(f"ratio_median{suffix}", {}).get(k, 0), per)
    load = state["load"].get(name, {})
    theirs = state["load"].get("llama_cpp", {}) if other else {}
    for k, v in load.items():
        if k == "cache_written_gib":
            print(f"{k:<22}{v:>14.3f}")
        elif k in theirs:
            row(k, v, theirs[k], results[f"load_ratio{suffix}"][k])
        else:
            row(k, v, 0, 0)


if __name__ == "__main__":
    main()
