"""pytest plugin used by scripts/sanitize_index.sh: loads the sanitizer build of the extension as ``fastdpr._C``
before any test imports it (the editable install would otherwise supply the normal build)."""
import importlib.util
import os
import sys

import fastdpr

_path = os.environ["FASTDPR_SANITIZED_EXTENSION"]
_spec = importlib.util.spec_from_file_location("fastdpr._C", _path)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
sys.modules["fastdpr._C"] = _module
fastdpr._C = _module
print(f"fastdpr._C <- {_path}", file=sys.stderr)
