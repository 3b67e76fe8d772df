"""jgsess's settings, read from the environment in this one module.

A setting is read when a program is compiled: each new trace of a jgsess.jit function (a new
signature, or any after `f.clear_cache()`) and each new `jgsess.jit(f)` compiles under the
settings of that moment; a program already compiled keeps those it was compiled under
(`fingerprint`). JGSESS_SIMD is read once, when jgsess._C loads; JGSESS_ROAD when each
jgsess.jit function is made.

JGSESS_DUMP=dir        write the graph after each pass (text, .dot), the execution order (CSV)
                       and the memory plan (JSON, PNG) under dir/<function>-<n>/
JGSESS_DISABLE=a,b     turn off the passes named a and b
JGSESS_KERNELS=off     every fused node runs its pure-JAX reference; =off:adamw,momentum turns
                       off just those kernels; =on (=on:adamw,...) takes the kernels wherever
                       they run, neither measured nor weighed by a cost model
JGSESS_NUMERICS=exact  the adamw kernel divides (IEEE division, as numpy does) where the
                       default multiplies by per-call reciprocals, as XLA's CPU code does
JGSESS_PREFER=memory   also take kernels that save memory at a small cost in speed (ReLU
                       bit-mask residuals: less temp memory, a slower step on the CPU)
JGSESS_BUCKETS=on|off  bucket-all-reduce: take the rewrite without measuring, or never (default:
                       where it measured faster than XLA's own all-reduces)
JGSESS_BUCKET_MB=25    the largest all-reduce bucket, in MB (0 turns bucketing off)
JGSESS_SIMD=avx2      cap the CPU kernels' vector loops at baseline|avx2|avx512 (read at import)
JGSESS_STRICT=1        a failure inside the pipeline raises instead of falling back to jax.jit,
                       and so does a jgsess._C that cannot be loaded
JGSESS_VERIFY=1        check the graph's invariants after every pass (always on in the tests)
JGSESS_AUTOTUNE=1|0|cached, JGSESS_AUTOTUNE_CACHE=path, JGSESS_AUTOTUNE_BUDGET=s
                       kernel measurement: see jgsess/autotune.py
JGSESS_ROAD=public     jgsess.jit functions made from now on take the public road (jax's
                       public API only, jgsess/_replay.py) even where jax.jit's step is hooked
"""

from __future__ import annotations

import os

_registrations = [0]  # how many times the users' kernel registrations changed


def registrations_changed() -> None:
    """A kernel registration began or ended (jgsess.register_replacement): programs compiled
    from now on are kept apart from those compiled before."""
    _registrations[0] += 1


def fingerprint() -> tuple:
    """Every JGSESS_* setting as it is now, as sorted (name, value) pairs, and the generation of
    the users' kernel registrations: what a compiled program is kept under."""
    settings = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("JGSESS_")))
    return (*settings, ("registrations", _registrations[0]))


def road() -> str:
    """JGSESS_ROAD: "public" forces jgsess.jit's public road; else "hook" (the hook where its
    probe passes, the public road where not)."""
    return "public" if os.environ.get("JGSESS_ROAD", "").strip().lower() == "public" else "hook"


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def dump_dir() -> str | None:
    return os.environ.get("JGSESS_DUMP") or None


def disabled_passes() -> set[str]:
    return {p.strip() for p in os.environ.get("JGSESS_DISABLE", "").split(",") if p.strip()}


def _kernels(setting: str, name: str) -> bool:
    """Whether JGSESS_KERNELS says `setting` (off, on) for the kernel `name`."""
    value = os.environ.get("JGSESS_KERNELS", "").strip().lower()
    if setting == "off" and value in ("0", "false", "none"):
        return True
    if value == setting:
        return True
    return value.startswith(setting + ":") and name in {
        k.strip() for k in value.split(":")[1].split(",")
    }


def kernel_enabled(name: str) -> bool:
    return not _kernels("off", name)


def kernel_forced(name: str) -> bool:
    """JGSESS_KERNELS=on (or on:name,...) takes the kernel without measuring it."""
    return _kernels("on", name)


def simd_cap() -> str:
    """JGSESS_SIMD: the widest instruction set the CPU kernels' vector loops may use."""
    return os.environ.get("JGSESS_SIMD", "").strip().lower()


def exact_numerics() -> bool:
    return os.environ.get("JGSESS_NUMERICS", "").strip().lower() == "exact"


def prefer_memory() -> bool:
    return os.environ.get("JGSESS_PREFER", "").strip().lower() == "memory"


def strict() -> bool:
    return _flag("JGSESS_STRICT")


def verify() -> bool:
    return _flag("JGSESS_VERIFY")


def buckets() -> str:
    setting = os.environ.get("JGSESS_BUCKETS", "").strip().lower()
    return setting if setting in ("on", "off") else "measure"


def bucket_bytes() -> int:
    return int(float(os.environ.get("JGSESS_BUCKET_MB", "25")) * 2**20)


def autotune_mode() -> str:
    """JGSESS_AUTOTUNE as "measure" (the default), "off" or "cached"."""
    setting = os.environ.get("JGSESS_AUTOTUNE", "1").strip().lower()
    if setting == "cached":
        return "cached"
    return "off" if setting in ("0", "off", "false") else "measure"


def autotune_cache() -> str:
    """The measurement cache's file: JGSESS_AUTOTUNE_CACHE, else ~/.cache/jgsess/autotune.json."""
    default = os.path.join(os.path.expanduser("~"), ".cache", "jgsess", "autotune.json")
    return os.environ.get("JGSESS_AUTOTUNE_CACHE") or default


def autotune_budget() -> float | None:
    setting = os.environ.get("JGSESS_AUTOTUNE_BUDGET")
    return float(setting) if setting else None
