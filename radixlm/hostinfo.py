"""What machine a benchmark ran on: CPU model, cores, and the ISA features that decide the
CPU paths (every benchmark prints this and puts it in its JSON)."""

from __future__ import annotations

import os
import platform

ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16",
             "amx_int8")


def host_info() -> dict:
    from radixlm import envs
    from radixlm.native.build import cpu_flags, host_cpu_flags

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("", platform.machine()):
                    model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    flags, host_flags = set(cpu_flags()), set(host_cpu_flags())
    info = {"cpu": model, "cores": os.cpu_count(), "machine": platform.machine(),
            "isa": [f for f in ISA_FLAGS if f in flags]}
    if envs.cpu_isa() != "native":  # an emulated host: say so, and what the real one has
        info["emulated_isa"] = envs.cpu_isa()
        info["host_isa"] = [f for f in ISA_FLAGS if f in host_flags]
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    try:
        from radixlm.native.build import load

        lib = load()
        info["native"] = lib.rlm_isa().decode() if lib is not None else "unavailable"
    except Exception as exc:  # noqa: BLE001 - a report, never a failure
        info["native"] = f"unavailable ({exc})"
    return info


def host_line(info: dict | None = None) -> str:
    info = info or host_info()
    line = (f"host: {info['cpu']}, {info['cores']} cores, ISA {'/'.join(info['isa']) or 'none'}"
            f", native ops {info.get('native')}")
    if "emulated_isa" in info:
        line += (f" [RADIXLM_CPU_ISA={info['emulated_isa']}: capped from "
                 f"{'/'.join(info['host_isa'])}; torch capped via ATEN_CPU_CAPABILITY="
                 f"{os.environ.get('ATEN_CPU_CAPABILITY')}]")
    return line
