"""Index spec strings: ``"hnsw,M=32,efc=200,fp16"`` -> ``("hnsw", {"M": 32, "efc": 200, "fp16": True})``, and the
registry of the index types a spec may name."""
from __future__ import annotations

from typing import Any

from fastdpr.errors import InputError

# kind -> "module:Class"; a type's module is imported only when that kind is built or loaded (``factory``)
REGISTRY: dict[str, str] = {
    "flat": "fastdpr.index.flat:FlatIndex",
    "hnsw": "fastdpr.index.hnsw:HNSWIndex",
    "ivfpq": "fastdpr.index.ivfpq:IVFPQIndex",
    "faiss": "fastdpr.index.faiss_adapter:FaissIndex",
}


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"hnsw,M=32,efc=200,fp16"`` -> ``("hnsw", {"M": 32, "efc": 200, "fp16": True})``.

    Values are int, float or str; a bare word is a flag (True). ``"faiss:<factory>"`` keeps the factory string
    whole: ``("faiss", {"factory": "<factory>"})``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InputError(f"index spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if spec.startswith("faiss:"):
        factory = spec[len("faiss:"):].strip()
        if not factory:
            raise InputError("index spec 'faiss:' needs a factory string, e.g. 'faiss:HNSW32,Flat'")
        return "faiss", {"factory": factory}
    parts = [p.strip() for p in spec.split(",")]
    kind = parts[0].lower()
    if kind not in REGISTRY and kind != "auto":
        raise InputError(f"unknown index type {parts[0]!r} in spec {spec!r}; expected one of "
                         f"{sorted(REGISTRY) + ['auto']}")
    params: dict[str, Any] = {}
    for p in parts[1:]:
        if not p:
            raise InputError(f"empty field in index spec {spec!r}")
        if "=" in p:
            key, value = (s.strip() for s in p.split("=", 1))
            if not key or not value:
                raise InputError(f"bad field {p!r} in index spec {spec!r}")
            value = parse_value(value)
        else:
            key, value = p, True
        # the last one winning would build something other than what one of them says
        if key in params:
            raise InputError(f"index spec {spec!r} gives {key!r} twice")
        params[key] = value
    return kind, params


def check_storage_flags(params: dict[str, Any], where: str) -> None:
    """The bare ``fp16`` and ``fp32`` flags of a spec exclude each other."""
    if params.get("fp16") is True and params.get("fp32") is True:
        raise InputError(f"{where}: fp16 and fp32 conflict; give one of them")


def parse_value(value: str) -> Any:
    """A parameter value written as text (spec strings, ``--search-param KEY=VALUE``): int, else float, else the
    string itself."""
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value
