"""A fingerprint of the passage tower, so that vectors of different weights never share a directory."""
from __future__ import annotations

import hashlib
import json

import numpy as np


def model_fingerprint(model) -> str:
    """A short hash of the passage tower's weights and the model config: vectors from different weights must never
    be mixed in one directory."""
    import torch

    h = hashlib.sha256(json.dumps(model.config.to_dict(), sort_keys=True).encode())
    with torch.no_grad():
        modules = [model.passage_encoder] + ([model.passage_projection] if model.passage_projection is not None
                                             else [])
        for module in modules:
            for name, param in module.named_parameters():
                flat = param.detach().reshape(-1)
                # sum, sum of squares and a strided sample: changes to any trained weight show up
                sample = flat[:: max(1, flat.numel() // 64)][:64].double().cpu().numpy()
                stats = [float(flat.double().sum()), float(flat.double().square().sum())]
                h.update(name.encode())
                h.update(np.asarray(stats + sample.tolist(), dtype=np.float64).tobytes())
    return h.hexdigest()[:16]
