"""Process-level tuning done when radixlm is imported (OpenMP spin, glibc malloc)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import radixlm  # noqa: F401  (applies the OpenMP setting; an Engine applies the malloc one)
from radixlm import envs


def test_openmp_spin_is_bounded_unless_overridden():
    assert os.environ.get("GOMP_SPINCOUNT") == os.environ.get("RADIXLM_OMP_SPINCOUNT", "20000")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_malloc_tuning_applies_and_can_be_turned_off(monkeypatch):
    assert envs.configure_malloc() is True
    monkeypatch.setenv("RADIXLM_MALLOC_TUNING", "0")
    assert envs.configure_malloc() is False


def test_large_temporaries_are_reused_not_refaulted():
    """With the tuning, the temporaries of an op on a prefill-sized activation are served
    again from the heap: repeating it adds no minor page faults. With glibc's defaults the
    heap top is trimmed between calls and every call faults its pages back in."""
    code = (
        "import resource, radixlm, torch, torch.nn.functional as F\n"
        "radixlm.envs.configure_malloc()  # what Engine() does\n"
        "def faults(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "x, w = torch.randn(1024, 576, dtype=torch.bfloat16), torch.ones(576)\n"
        "for _ in range(10): F.rms_norm(x.float(), (576,), w, 1e-5)\n"
        "before = faults()\n"
        "for _ in range(50): F.rms_norm(x.float(), (576,), w, 1e-5)\n"
        "print(faults() - before)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RADIXLM_MALLOC_TUNING"}
    tuned = int(subprocess.check_output([sys.executable, "-c", code], env=env, text=True))
    plain = int(subprocess.check_output([sys.executable, "-c", code], text=True,
                                        env={**env, "RADIXLM_MALLOC_TUNING": "0"}))
    assert plain > 1000 and tuned * 5 < plain, (tuned, plain)


def test_gc_freeze_moves_live_objects_out_of_collections(monkeypatch):
    """An engine's long-lived objects leave the collector's generations (no full-collection
    pauses walking them; Engine.shutdown gives them back); RADIXLM_GC_FREEZE=0 keeps
    Python's default."""
    import gc

    keep = [object() for _ in range(1000)]
    try:
        before = gc.get_freeze_count()
        assert envs.freeze_gc() is True
        assert gc.get_freeze_count() >= before + len(keep)
        gc.unfreeze()
        monkeypatch.setenv("RADIXLM_GC_FREEZE", "0")
        assert envs.freeze_gc() is False and gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()



def test_gc_paused_stops_the_collector_then_freezes_only_a_finished_stretch(monkeypatch):
    """Inside ``gc_paused`` nothing is collected; a stretch that ends without an exception
    leaves what is alive frozen and the collector as it was; one that raises unfreezes
    nothing new and restores the collector; with RADIXLM_GC_FREEZE=0 nothing is frozen."""
    import gc

    was = gc.isenabled()
    gc.enable()
    try:
        gc.unfreeze()
        with envs.gc_paused():
            assert not gc.isenabled()
            keep = [[i] for i in range(1000)]
        assert gc.isenabled() and gc.get_freeze_count() >= len(keep)
        gc.unfreeze()
        with pytest.raises(ValueError), envs.gc_paused():
            raise ValueError("a start that failed")
        assert gc.isenabled() and gc.get_freeze_count() == 0
        gc.disable()
        with envs.gc_paused():
            pass
        assert not gc.isenabled()  # (a collector the caller had off stays off)
        gc.enable()
        gc.unfreeze()
        monkeypatch.setenv("RADIXLM_GC_FREEZE", "0")
        with envs.gc_paused():
            pass
        assert gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
        (gc.enable if was else gc.disable)()
