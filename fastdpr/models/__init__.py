"""Dual encoders: towers, pooling, checkpoint loading (HF encoders, HF DPR, sentence-transformers)."""
from fastdpr.models.biencoder import BiEncoder, passage_fields
from fastdpr.models.config import BiEncoderConfig
from fastdpr.models.pooling import l2_normalize, pool

__all__ = ["BiEncoder", "BiEncoderConfig", "pool", "l2_normalize", "passage_fields"]
