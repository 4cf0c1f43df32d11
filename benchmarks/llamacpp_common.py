"""What the benchmarks' llama.cpp workers and their parents share (the workers run in
llama.cpp's own venv, so this imports nothing from radixlm)."""

from __future__ import annotations

import json


def add_extra_bufts_arg(ap) -> None:
    """``--llama-extra-bufts auto|on|off`` (bare: on) on ``ap``; ``extra_bufts_on`` reads it."""
    ap.add_argument("--llama-extra-bufts", choices=("auto", "on", "off"), default="auto",
                    nargs="?", const="on",
                    help="llama.cpp's extra weight buffer types (repacked layouts, AMX); "
                         "auto: llama.cpp's own default (on) except on a CPU with AMX tiles, "
                         "where its AMX matmul segfaults unless the tiles are granted (as on "
                         "the development VM)")


def extra_bufts_on(choice: str) -> bool:
    """Whether llama.cpp runs with its extra buffer types under ``choice`` (auto: as a user's
    llama.cpp would, but off where the CPU has AMX tiles; see ``add_extra_bufts_arg``)."""
    if choice != "auto":
        return choice == "on"
    try:
        with open("/proc/cpuinfo") as f:
            return not any(line.startswith("flags") and " amx_tile" in line for line in f)
    except OSError:
        return True


def use_plain_buffers(llama_cpp) -> None:
    """Turn off llama.cpp's extra weight buffer types (AMX and repacked layouts) for every
    model loaded after this: its AMX matmul segfaults where AMX tiles are not granted (as on
    the development VM), and a Q4_1 model gets no repacked layout anyway."""
    import llama_cpp.llama as high_level

    default_params = llama_cpp.llama_model_default_params

    def params():
        p = default_params()
        p.use_extra_bufts = False
        return p

    high_level.llama_cpp.llama_model_default_params = params


def announce_ready(llama_cpp, **extra) -> None:
    """The worker's first line: llama-cpp-python's version, what llama.cpp was built for, and
    ``extra`` (e.g. how long the model took to construct)."""
    features = llama_cpp.llama_print_system_info().decode().strip()
    print(json.dumps({"ready": llama_cpp.__version__, "features": features, **extra}),
          flush=True)


def status_kib(pid: int | str, key: str) -> int:
    """A ``/proc/PID/status`` size in KiB (``VmRSS``, ``VmHWM``: the peak resident set);
    0 where the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def mem_available() -> int:
    """The kernel's MemAvailable in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable")


def compile_bytecode(package_dir) -> str:
    """Compile ``package_dir``'s modules to bytecode where theirs is missing or stale (what
    pip does when it installs a package, and what the interpreter does at a first import
    unless ``PYTHONDONTWRITEBYTECODE`` is set), so a timed start reads bytecode as an
    installed package's would: radixlm runs from its source tree (an editable install), and
    with that variable set every start compiled its modules again (~0.09 s of a 1B GGUF's
    start on a 2-core Zen 5) while llama-cpp-python's and torch's came compiled. Returns a
    line for the report."""
    import compileall
    import io
    from contextlib import redirect_stdout

    with redirect_stdout(io.StringIO()) as out:
        ok = compileall.compile_dir(str(package_dir), quiet=0)
    compiled = out.getvalue().count("Compiling ")
    return (f"{package_dir} bytecode: {compiled} modules compiled before the starts"
            f"{'' if ok else ' (some failed)'}")


def memory_read_gbs(threads: int, mib: int = 512) -> float:
    """The host's memory read rate now, GB/s: ``mib`` MiB of fp32 summed by torch on
    ``threads`` threads, the best of 5 (torch imported here: call it from a parent in
    radixlm's venv). A one-token step of a GGUF streams its weights at this rate, and the
    VMs' rate moves ~1.6x within minutes, so the benchmarks print it beside each round."""
    import time

    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(mib << 18)
        x.sum()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - t0)
        return x.numel() * x.element_size() / best / 1e9
    finally:
        torch.set_num_threads(before)


def llama_streams(llm, prompts: list[list[int]], new: int, threads: int) -> dict:
    """Greedy ``new`` tokens for each of ``prompts`` at once, as llama-server's parallel
    slots run them: one context with a sequence per prompt (a unified KV cache), the
    prompts in one batch, then a batch of one token per sequence a step (argmax of its
    logits). The context is made before the clock starts. Returns ``ttft`` (the prompts'
    batch: every sequence's first token), ``total`` and ``tokens``, seconds."""
    import time

    import llama_cpp
    import numpy as np
    from llama_cpp import _internals

    n = len(prompts)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n * (max(map(len, prompts)) + new + 1)
    params.n_batch = params.n_ubatch = max(512, sum(map(len, prompts)))
    params.n_seq_max, params.kv_unified = n, True
    params.n_threads = params.n_threads_batch = threads
    ctx = _internals.LlamaContext(model=llm._model, params=params, verbose=False)
    batch = _internals.LlamaBatch(n_tokens=params.n_batch, embd=0, n_seq_max=n)
    vocab = llm.n_vocab()

    def argmax(i: int) -> int:
        return int(np.ctypeslib.as_array(ctx.get_logits_ith(i), shape=(vocab,)).argmax())

    try:
        t0 = time.perf_counter()
        for s, p in enumerate(prompts):
            batch.add_sequence(p, s, False)
        ctx.decode(batch)
        ends = np.cumsum([len(p) for p in prompts]) - 1
        toks = [argmax(int(i)) for i in ends]
        ttft = time.perf_counter() - t0
        pos = [len(p) for p in prompts]
        for _ in range(new - 1):
            batch.reset()
            b = batch.batch
            b.n_tokens = n
            for s in range(n):
                b.token[s], b.pos[s], b.seq_id[s][0], b.n_seq_id[s] = toks[s], pos[s], s, 1
                b.logits[s] = True
                pos[s] += 1
            ctx.decode(batch)
            toks = [argmax(s) for s in range(n)]
        return {"ttft": ttft, "total": time.perf_counter() - t0, "tokens": n * new}
    finally:
        batch.close()
        ctx.close()
