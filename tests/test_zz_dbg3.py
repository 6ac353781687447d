import sys, tempfile, torch
import torch.multiprocessing as mp
import test_train_ddp as T
from fastdpr.models import BiEncoder
from fastdpr.train.trainer import Trainer

def _noop(rank):
    pass

def test_x(tmp_path):
    m = T.tiny_biencoder(tmp_path, dropout=0.0, max_passage_length=48); m.save_pretrained(tmp_path / "init")
    mp.spawn(_noop, nprocs=2)
    ex = T._examples()
    for be in ["auto", "torch", "auto", "reference"]:
        tr = Trainer(BiEncoder.from_pretrained(tmp_path / "init"), T._args(tempfile.mkdtemp(), loss_backend=be), ex)
        b = tr.builder.batch(0, 1)
        print(be, float(tr.training_step(b)))
    assert 0
