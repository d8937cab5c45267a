"""The package must import and work without torch or any DeepInfer package."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
import deepseek_recipe as dr
body = {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "hi"}]}
req = dr.ChatCompletionRequest(body)
conv = req.convert(dr.ConversionOptions()).conversation
dr.DeepseekV4Encoding().render_conversation(conv)
bad = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "deepinfer", "numpy"})
print(",".join(bad))
"""


def test_imports_without_torch_or_deepinfer() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
