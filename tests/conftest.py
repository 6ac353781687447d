# TRITON_INTERPRET must be set before anything imports triton (transformers imports it through torch._dynamo),
# so it is set here, at the top of the first file pytest loads.
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    # a shared 2-core box: oversubscribed BLAS threads make every test slower
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    yield


@pytest.fixture
def data_dir() -> Path:
    return DATA
