"""What machine this is: CPU model, cores, and the ISA features that decide the CPU paths.

The CPU flags are read here, at the bottom of the package, for everyone who chooses a path
from them (the native library's build, the runtime's dtype). ``host_info`` is the report
every benchmark prints and puts in its JSON; the native library's own line in it is probed
one layer up (``radixlm.native.build.host_info``), since this module imports nothing above
``radixlm.envs``.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from radixlm import envs

ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16",
             "amx_int8")

# flags a CPU capped at RADIXLM_CPU_ISA does not have (prefixes)
_ABOVE = {"avx2": ("avx512", "amx", "avx_vnni", "avx_ifma", "avx_ne_convert"),
          "generic": ("avx", "amx", "fma", "f16c")}


def _cpuinfo(*keys: str) -> str:
    """The value of the first /proc/cpuinfo line starting with one of ``keys`` ("" where
    there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(keys):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def host_cpu_flags() -> list[str]:
    """The CPU feature flags of /proc/cpuinfo (empty where there is none)."""
    return sorted(set(_cpuinfo("flags", "Features").split()))


def cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id (AuthenticAMD, GenuineIntel, ...; empty where none)."""
    return _cpuinfo("vendor_id")


def cpu_flags() -> list[str]:
    """The flags the paths are chosen from: the host's, less what ``RADIXLM_CPU_ISA``
    caps away."""
    isa = envs.cpu_isa()
    flags = host_cpu_flags()
    if isa == "native":
        return flags
    return [f for f in flags if not f.startswith(_ABOVE[isa])]


def cpu_has_native_bf16() -> bool:
    """bf16 dot products in hardware (the flags RADIXLM_CPU_ISA leaves)."""
    flags = set(cpu_flags())
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_dtype_name(asked: str, checkpoint: str | None, native_bf16: bool) -> str:
    """The dtype a CPU engine runs (``runtime.device.pick_device_dtype``; torch-free, so a
    start reads it before torch is imported: ``runtime/early.py``): ``asked`` unless "auto";
    else fp32 for an fp32 / fp16 checkpoint (fp16 exactly), and for a bf16 one or a
    checkpoint without a dtype (a GGUF) bf16 where ``native_bf16``, else fp32."""
    if asked != "auto":
        return asked
    if checkpoint in ("float32", "float16") or not native_bf16:
        return "float32"
    return "bfloat16"


def checkout() -> str:
    """The radixlm this process imported: its folder, and where that is a git checkout its
    commit (``-dirty`` with changes). A benchmark run from a ``git worktree`` imports the
    editable install's radixlm, not the worktree's: this line says which code ran."""
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"{root} @ {rev}" if rev else str(root)


def host_info(native: str | None = None) -> dict:
    """CPU model, cores, ISA (and the real host's under ``RADIXLM_CPU_ISA``), torch's
    version and threads; ``native``: the native library's line (what
    ``radixlm.native.build.host_info`` passes)."""
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
            "isa": [f for f in ISA_FLAGS if f in flags], "radixlm": checkout()}
    if envs.cpu_isa() != "native":  # an emulated host: say so, and what the real one has
        info["emulated_isa"] = envs.cpu_isa()
        info["host_isa"] = [f for f in ISA_FLAGS if f in host_flags]
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    if native is not None:
        info["native"] = native
    return info


def host_line(info: dict | None = None) -> str:
    info = info or host_info()
    line = (f"host: {info['cpu']}, {info['cores']} cores, ISA {'/'.join(info['isa']) or 'none'}"
            f", native ops {info.get('native')}; radixlm {info.get('radixlm')}")
    if "emulated_isa" in info:
        line += (f" [RADIXLM_CPU_ISA={info['emulated_isa']}: capped from "
                 f"{'/'.join(info['host_isa'])}; torch capped via ATEN_CPU_CAPABILITY="
                 f"{os.environ.get('ATEN_CPU_CAPABILITY')}]")
    return line
