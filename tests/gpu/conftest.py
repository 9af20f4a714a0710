"""The GPU tests reuse the integration tests' fixtures (mounts, corpus) and helpers; they need a
CUDA device and fail, rather than skip, without one: `make gpu-test` is run where there is one."""
import importlib.util
import sys
from pathlib import Path

import pytest

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
sys.path.insert(0, str(INTEGRATION))
_spec = importlib.util.spec_from_file_location("integration_conftest", INTEGRATION / "conftest.py")
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
globals().update({k: v for k, v in vars(_fixtures).items() if not k.startswith("_")})


@pytest.fixture(scope="session", autouse=True)
def cuda_device():
    import ckload
    import torch
    if not (ckload.cuda_built() and ckload.cuda_available() and torch.cuda.is_available()):
        pytest.fail("make gpu-test needs a CUDA device, a torch with CUDA and a libckload built "
                    f"with the CUDA toolkit (built: {ckload.cuda_built()}, usable: "
                    f"{ckload.cuda_available()}, torch: {torch.cuda.is_available()})")
    torch.cuda.init()
    return torch.device("cuda:0")
