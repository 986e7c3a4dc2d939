"""Tiny-model tests run their many small ops on one thread: on a shared 2-core machine two OpenMP
threads wait on each other at every op and a millisecond reply takes hundreds of milliseconds."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
