# TRITON_INTERPRET must be set before anything imports triton (transformers imports it through torch._dynamo),
# so it is set here, at the top of the first file pytest loads.
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

# the published QA files: the checkout's shared copy (as CI lays it beside the clone) when no other is named
_SHARED_QA = Path(__file__).resolve().parents[2] / "shared" / "data" / "qa"
if _SHARED_QA.is_dir():
    os.environ.setdefault("FASTDPR_DATA_DIR", str(_SHARED_QA))

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
