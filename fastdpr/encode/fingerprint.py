"""A fingerprint of the passage tower, so that vectors of different weights never share a directory."""
from __future__ import annotations

import hashlib
import json

import numpy as np


#: the settings that change a passage's vector (sharing a tower, the temperature or the question length do not:
#: a model whose question tower was fine-tuned against frozen passages keeps its corpus vectors)
PASSAGE_SETTINGS = ("pooling", "similarity", "projection_dim", "max_passage_length", "pair_token_types", "lowercase")


def model_fingerprint(model) -> str:
    """A short hash of the passage tower's weights and the settings that shape its vectors: vectors from different
    weights must never be mixed in one directory.

    The weights' bytes are hashed, not statistics of them: a float sum depends on how many threads reduce it, and
    a fingerprint that changed with ``torch.set_num_threads`` refused vectors of the very same model."""
    import torch

    settings = model.config.to_dict()
    h = hashlib.blake2b(json.dumps({k: settings[k] for k in PASSAGE_SETTINGS}, sort_keys=True).encode(),
                        digest_size=16)
    with torch.no_grad():
        modules = [model.passage_encoder] + ([model.passage_projection] if model.passage_projection is not None
                                             else [])
        for module in modules:
            for name, param in module.named_parameters():
                h.update(name.encode())
                h.update(str(param.dtype).encode())
                h.update(np.ascontiguousarray(param.detach().cpu().float().numpy()).tobytes())
    return h.hexdigest()[:16]
