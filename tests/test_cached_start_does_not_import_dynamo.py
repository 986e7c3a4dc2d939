"""Loading a model never imports torch._dynamo: that import alone was 1.4 s of a 3.3 s cached start.

Building the model on the meta device used to run the modules' random init and the rotary table through
torch's meta decompositions, which import torch._dynamo on first use. Checked in a fresh interpreter, the
way `parley generate` starts (no clock involved: the module is either imported or not)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
from parley.engine.engine import Engine
from parley.models.resolve import embedded_model_path
engine = Engine.load(str(embedded_model_path()), quant="none")
assert engine.model.inv_freq.device.type == "cpu" and engine.model.inv_freq.abs().sum() > 0
print("dynamo imported" if "torch._dynamo" in sys.modules else "dynamo not imported")
"""


def test_loading_the_embedded_model_does_not_import_dynamo():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "dynamo not imported", out.stdout
